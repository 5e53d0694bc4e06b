import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The REST root of the SpotWarp server extension, under the server's base URL. */
export const API_NAMESPACE = 'spotwarp/api';

/** An HTTP error from the SpotWarp API, with the server's one-line message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** The signature of `requestAPI`, so the model can be given a fake one in tests. */
export type RequestFn = <T>(endPoint?: string, init?: RequestInit) => Promise<T>;

/**
 * Call the SpotWarp REST API.
 *
 * @param endPoint path under `spotwarp/api/`, e.g. `status`
 * @param init fetch options (method, body)
 * @returns the decoded JSON answer
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text };
    }
  }
  if (!response.ok) {
    const message =
      (data && typeof data === 'object' && data.message) ||
      `${response.status} ${response.statusText}`;
    throw new ApiError(response.status, String(message));
  }
  return data as T;
}

import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="24" height="24" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 2 4 5.5v5.8c0 5 3.4 9.6 8 10.7 4.6-1.1 8-5.7 8-10.7V5.5L12 2zm0 2.2 6 2.6v4.5c0 4-2.6 7.7-6 8.6-3.4-.9-6-4.6-6-8.6V6.8l6-2.6z"/>
    <path d="M12.6 7.5v2.3H8.5v2.4h4.1v2.3l3.6-3.5-3.6-3.5z"/>
  </g>
</svg>`;

/** The SpotWarp icon: a shield with a forward arrow (a session carried over). */
export const spotwarpIcon = new LabIcon({ name: 'spotwarp:icon', svgstr: svg });

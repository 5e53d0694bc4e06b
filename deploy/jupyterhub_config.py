# SpotWarp for every user of a JupyterHub (any spawner): include this file from your own
# jupyterhub_config.py with `load_subconfig("/etc/jupyterhub/spotwarp_config.py")`, or copy its lines.
# See docs/jupyterhub.md. The single-user image installs `spotwarp-jupyter` (the server extension is then on
# by itself) and carries deploy/jupyter_server_config.py and deploy/ipython_*config.py.
import hashlib
import hmac
import os

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

# One storage prefix per user and server. The hub passes the template as it is; SpotWarp fills
# {username} and {server_name} in the single-user server from JUPYTERHUB_USER and
# JUPYTERHUB_SERVER_NAME (an unnamed server is "default"), so nobody's snapshots share a prefix.
SPOTWARP_STORAGE = os.environ.get("SPOTWARP_HUB_STORAGE", "s3://my-team-bucket/spotwarp/{username}/{server_name}")

c.Spawner.environment.update({
    "SPOTWARP_STORAGE": SPOTWARP_STORAGE,
    # a fresh server (new pod, empty home) gets the user's newest workspace snapshot back before it serves
    "SPOTWARP_RESTORE_ON_START": "auto",
    # files are backed up every 2 minutes when something changed; kernels snapshot themselves
    "SPOTWARP_BACKUP_INTERVAL": "2m",
    # the final snapshot after SIGINT/SIGTERM fits the time a local spawner gives a stopping server
    # (SIGINT, then SIGTERM after LocalProcessSpawner.interrupt_timeout, 10 s); on Kubernetes see values.yaml
    "SPOTWARP_SHUTDOWN_GRACE": "10",
})

# Storage credentials and endpoint: name the hub's variables to pass on, never write secrets here.
# (On Kubernetes, prefer per-user credentials: see the guide's values.yaml.)
_passed = os.environ.get("SPOTWARP_HUB_PASS_ENV", "SPOTWARP_STORAGE_OPTIONS").split()
c.Spawner.environment.update({name: os.environ[name] for name in _passed if name in os.environ and name != "SPOTWARP_KEY"})

# Signing: every user gets their own SPOTWARP_KEY, HMAC-SHA256(hub secret, user name), never one key
# for all (with one key, anyone could sign snapshots another user's server accepts). The hub secret
# (SPOTWARP_HUB_KEY_SECRET, or the hub's SPOTWARP_KEY) stays in the hub.
_key_secret = os.environ.get("SPOTWARP_HUB_KEY_SECRET") or os.environ.get("SPOTWARP_KEY")


def spotwarp_user_key(spawner):
    """The user's own signing key, derived from the hub secret and the user's name."""
    return hmac.new(_key_secret.encode(), b"spotwarp user key:" + spawner.user.name.encode(), hashlib.sha256).hexdigest()


if _key_secret:
    c.Spawner.environment.update({"SPOTWARP_KEY": spotwarp_user_key})

# Sharing: people a user shares a server with may look (read) but not run code or change files there,
# unless the share grants these scopes (SpotWarpHubAuthorizer in the image's server config checks them).
c.JupyterHub.custom_scopes = {
    "custom:jupyter_server:execute:*": {"description": "Run code (kernels, terminals) and restore snapshots in a shared server."},
    "custom:jupyter_server:write:*": {"description": "Change files and take snapshots in a shared server."},
}
c.Spawner.oauth_client_allowed_scopes = ["custom:jupyter_server:execute:*", "custom:jupyter_server:write:*"]

# Restoring a large workspace at start takes time: give the server longer to answer the hub.
c.Spawner.http_timeout = 300
c.Spawner.start_timeout = 600

# Users' own ~/.jupyter config must not turn the settings above (or the authorizer) off.
c.Spawner.disable_user_config = True

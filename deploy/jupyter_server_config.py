# The single-user image's server config for SpotWarp (copy it to /etc/jupyter/ in the image).
# The extension itself is enabled by `pip install spotwarp-jupyter`; this adds what a hub deployment wants.
# See docs/jupyterhub.md.
c = get_config()  # noqa: F821 - provided by Jupyter when it loads this file

# People the owner shares this server with (JupyterHub sharing) may list SpotWarp's snapshots,
# never take or restore them; the owner keeps every right. Other resources are not affected.
c.ServerApp.authorizer_class = "spotwarp_jupyter.server.hub.SpotWarpHubAuthorizer"

# On a fresh server (a new pod after a preemption, an empty home) restore the newest workspace
# snapshot before serving. "auto" does this only under JupyterHub; SPOTWARP_RESTORE_ON_START wins.
c.SpotWarp.restore_on_start = "auto"

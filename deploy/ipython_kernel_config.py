# Every notebook kernel in the single-user image (copy it to /etc/ipython/ipython_kernel_config.py):
# SpotWarp is loaded when the kernel starts, so every notebook is protected from its first cell
# (automatic snapshots, kernel state in the server's project snapshots and in the preStop one).
# Leave this file out to make SpotWarp opt-in: `%spotwarp` still works (ipython_config.py).
c = get_config()  # noqa: F821 - provided by IPython when it loads this file

c.InteractiveShellApp.extensions = ["spotwarp"]

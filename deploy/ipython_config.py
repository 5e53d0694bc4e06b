# Every IPython in the single-user image (copy it to /etc/ipython/ipython_config.py):
# `%spotwarp` works without `%load_ext spotwarp`. The first `%spotwarp` loads the extension.
c = get_config()  # noqa: F821 - provided by IPython when it loads this file

c.MagicsManager.lazy_magics = {"spotwarp": "spotwarp"}

"""Automatic failover: race candidate hosts through a provider, promote the first serving one, watch it.

See docs/failover.md. No Jupyter imports.
"""

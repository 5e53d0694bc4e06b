"""Automatic failover: race candidate hosts through a provider, promote the first serving one, watch it (docs/failover.md)."""

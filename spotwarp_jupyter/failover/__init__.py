"""Automatic failover: race candidate hosts, keep the first serving a restored session, fence the rest."""

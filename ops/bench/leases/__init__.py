"""``kvroute bench leases`` (live, ``bench``), ``bench lease-model`` (virtual time,
``model``) and ``bench prewarm`` (a new replica's first minute, ``prewarm``)."""

"""``kvroute bench autoscale`` (the run: ``bench``; its options: ``options``; the replica
watcher: ``watch``) and ``kvroute bench autoscale-pool`` (``pool``, a post-processor)."""

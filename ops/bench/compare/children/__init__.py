"""Child processes of ``kvroute bench compare``, each run as ``python -m`` or by path: the
plain echo app, the round-robin front, Dynamo's socket relay and worker shim."""

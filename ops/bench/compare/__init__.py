"""``kvroute bench compare``: kvroute against peer routers over the same replicas
(``bench``), scaled out (``scaling``), the peers' installs (``peers``, ``dynamo_peer``) and
the child processes the runs start (``children``)."""

"""What the tests stand on and hold no test of their own: settings modules (settings/), ASGI
applications (asgi/), harnesses (Valkey, cluster, proxy, servers, workers, browser), child
processes (children/), fakes and the small Django apps the worker processes load."""

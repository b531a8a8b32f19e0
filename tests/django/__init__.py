"""The Django side: settings and system checks, the access policy on every surface, the REST
API (api/), the admin (admin/), the queue WebSocket (ws/), the management command,
receipts, tracing and redaction."""

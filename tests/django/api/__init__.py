"""The REST API: endpoints, status codes and the OpenAPI document."""

"""The outbox admin: pages, actions, paging, previews, the dashboard, a cluster's merged indices."""

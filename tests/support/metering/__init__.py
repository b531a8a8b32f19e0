"""A metering app for worker processes: a ``once=True`` receiver writes one row
per delivery into a database file every worker shares; see tests/support/settings/receipts.py."""

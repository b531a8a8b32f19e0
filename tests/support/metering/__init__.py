"""A metering app for worker processes (issue 18): a ``once=True`` receiver writes one row
per delivery into a database file every worker shares; see tests/support/settings/receipts.py."""

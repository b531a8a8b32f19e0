"""An app whose ``entry_delivered`` receivers write one row per delivery through the ORM, for
worker processes on a real database (tests/faults/test_database_restart.py): see
:mod:`tests.support.dbwrites.receivers`."""

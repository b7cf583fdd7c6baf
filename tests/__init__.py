"""LedgerMQ test suite: tiers mirror the package layout."""

"""The pyverbs-compatible API over softnic (module names as in pyverbs)."""

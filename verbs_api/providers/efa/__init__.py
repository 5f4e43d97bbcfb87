"""EFA direct verbs (``pyverbs.providers.efa``): not a device softnic is."""

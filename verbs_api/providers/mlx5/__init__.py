"""mlx5 direct verbs (``pyverbs.providers.mlx5``): not a device softnic is."""

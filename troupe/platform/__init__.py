"""The runtime: config, roles and placement, the driver loop, the data plane, registries,
checkpoints, metrics and run reports. It imports no algorithm, actor or environment."""

"""Cost models: communication (collectives on a two-tier network), compute (kernel-time
estimators), memory per device, and the per-layer costs of a layout."""

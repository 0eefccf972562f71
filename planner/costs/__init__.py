"""Cost models: communication (collectives on a two-tier network), compute (kernel-time
estimators), memory per device, and the per-layer costs of a layout."""

#: the accountings a question may ask for (``--cost-model``): here, without numpy, so
#: that ``planner launch`` checks a plan's setting as cheaply as it reads it
COST_MODELS = ("exact", "gholami2018")
#: whether weight-gradient reductions overlap the backward pass (``--overlap``)
OVERLAPS = ("none", "gradients")

"""The pipeline schedules a plan names (``problem.pipeline.schedule``), apart from
:mod:`planner.pipeline` so that readers of plans (``planner launch``) need not load it."""

#: the schedule priced (its memory: min(S - s, M) microbatches in flight at stage s)
SCHEDULE = "1f1b"
#: the schedule with more than one model chunk a stage
INTERLEAVED = "interleaved-1f1b"
#: 1F1B with each backward pass split into B (input gradients) and W (weight gradients),
#: the W passes deferred into the idle time (Qi et al., ICLR 2024, ZB-H1)
ZERO_BUBBLE = "zb-h1"
#: what ``--schedule`` takes
SCHEDULES = (SCHEDULE, ZERO_BUBBLE)
#: the passes of one microbatch through a stage each schedule runs, as a stage record
#: names them (``passes_s``)
PASSES = {SCHEDULE: ("forward", "backward"), INTERLEAVED: ("forward", "backward"),
          ZERO_BUBBLE: ("forward", "input_grad", "weight_grad")}

"""What the local search on the overlapped timeline gains over the dynamic program
(not a test module).

    python tests/benchmarks/local_search.py

For each question (example networks and clusters, ``overlap: gradients``, Adam, the
learned kernel models) it plans twice, without the local search
(``LOCAL_BUDGET`` = 0) and with it, and prints both iteration times, the gain, the lower
bound the plan records (``search.lower_bound_s``), how far the plan is above it, the
assignments the local search evaluated and the search's wall time (one run; the
machine's load moves it). The README's table under *Search* comes from here.
"""

from __future__ import annotations

import time

import planner.cli  # noqa: F401  (loads the command modules in their order)
from planner import search as search_module
from planner.cli_plan import load_question

QUESTIONS = (
    ("alexnet", "cori-knl", 64, 512),
    ("alexnet", "cori-knl", 512, 2048),
    ("alexnet", "dgx-h100", 64, 1024),
    ("vgg16", "dgx-h100", 64, 1024),
    ("resnet50", "dgx-h100", 256, 4096),
    ("resnet50", "pcie-8gpu", 8, 256),
    ("gpt2-small", "dgx-h100", 64, 64),
    ("gpt2-small", "dgx-h100", 256, 512),
)


def main() -> None:
    budget = search_module.LOCAL_BUDGET
    print("| network, cluster, P, B | dynamic program | with local search | gain | "
          "lower bound | above it | evaluated | search wall |")
    print("|---|---|---|---|---|---|---|---|")
    for net, cluster, p, b in QUESTIONS:
        q = load_question(f"examples/networks/{net}.yaml", f"examples/clusters/{cluster}.yaml",
                          p, b, "exact", "gradients", "25MiB", "adam", None, None, "auto", None)
        search_module.LOCAL_BUDGET = 0
        before = search_module.search(q.ctx, q.options, "time", {})
        search_module.LOCAL_BUDGET = budget
        t0 = time.perf_counter()
        after = search_module.search(q.ctx, q.options, "time", {})
        wall = time.perf_counter() - t0
        t_dp, t_ls = before.best.score("time"), after.best.score("time")
        low = after.lower_bound_s or 0.0
        print(f"| {net}, {cluster}, {p}, {b} | {t_dp * 1e3:.3f} ms | {t_ls * 1e3:.3f} ms | "
              f"{(1 - t_ls / t_dp) * 100:.1f}% | {low * 1e3:.3f} ms | "
              f"{(t_ls / low - 1) * 100:.1f}% | {after.explored - before.explored} | "
              f"{wall:.2f} s |")


if __name__ == "__main__":
    main()

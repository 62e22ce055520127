"""Host-side PNG figures of the evaluation (matplotlib Agg canvas, no display, no pyplot state).

Dimension legend (this module): U budget tiers, J values of k, Db depth bins, It logged training iterations.
Every function takes arrays and an output path, writes one PNG and returns the path.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _new(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    fig = Figure(figsize=(width * ncols, height), dpi=100)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _save(fig, path) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _curves(ax, x, curves: Mapping[str, np.ndarray], bands: Mapping[str, tuple] | None):
    for label, y in curves.items():
        line, = ax.plot(x, np.asarray(y), marker="o", label=label)
        if bands and label in bands:
            lo, hi = bands[label]
            ax.fill_between(x, np.asarray(lo), np.asarray(hi), color=line.get_color(), alpha=0.2)


def pass_kt_heatmap(pass_UxJ, budgets_U, ks_J, path, *, title: str = "Pass@(K,T)") -> str:
    """Heatmap of the task-mean Pass@(K,T) grid, annotated with each cell's value."""
    grid = np.asarray(pass_UxJ, np.float64)
    if grid.shape != (len(budgets_U), len(ks_J)):
        raise ValueError(f"pass_UxJ shape {grid.shape} does not match {len(budgets_U)} budgets x {len(ks_J)} ks")
    fig, (ax,) = _new(width=5.5, height=4.0)
    image = ax.imshow(grid, origin="lower", aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(len(ks_J)), [str(k) for k in ks_J])
    ax.set_yticks(range(len(budgets_U)), [str(t) for t in budgets_U])
    ax.set_xlabel("K (independent trajectories)")
    ax.set_ylabel("T (turn budget)")
    for (t, k), value in np.ndenumerate(grid):
        ax.text(k, t, f"{value:.2f}", ha="center", va="center", color="w" if value < 0.6 else "k", fontsize=8)
    fig.colorbar(image, ax=ax)
    ax.set_title(title)
    return _save(fig, path)


def pass_at_t_curves(budgets_U, curves: Mapping[str, np.ndarray], path, *, bound_U=None,
                     bands: Mapping[str, tuple] | None = None, k: int = 8) -> str:
    """Pass@T at fixed K per policy, with the structural upper bound drawn beside them (dashed)."""
    fig, (ax,) = _new()
    x = np.asarray(budgets_U)
    _curves(ax, x, curves, bands)
    if bound_U is not None:
        ax.plot(x, np.asarray(bound_U), "k--", label="upper bound")
    ax.set(xlabel="T (turn budget)", ylabel=f"Pass@{k}", ylim=(-0.02, 1.02), title=f"Pass@T at K={k}")
    ax.legend()
    return _save(fig, path)


def pass_at_k_curves(ks_J, curves: Mapping[str, np.ndarray], path, *, bands: Mapping[str, tuple] | None = None,
                     budget: int | None = None) -> str:
    """Pass@K curves (log-2 K axis) at one budget per policy."""
    fig, (ax,) = _new()
    _curves(ax, np.asarray(ks_J), curves, bands)
    ax.set_xscale("log", base=2)
    suffix = "" if budget is None else f" at T={budget}"
    ax.set(xlabel="K", ylabel="Pass@K", ylim=(-0.02, 1.02), title="Pass@K" + suffix)
    ax.legend()
    return _save(fig, path)


def step_quality_by_depth(bin_edges_D1, share_better_Db, share_equal_Db, share_worse_Db, mean_q_base_Db,
                          mean_q_rl_Db, path) -> str:
    """Left: stacked shares of states where RL is better / tied / worse per depth bin; right: mean q."""
    edges = np.asarray(bin_edges_D1, np.float64)
    centers, width = (edges[:-1] + edges[1:]) / 2, np.diff(edges) * 0.9
    shares = (share_better_Db, share_equal_Db, share_worse_Db)
    better, equal, worse = (np.nan_to_num(np.asarray(v, np.float64)) for v in shares)  # empty bins draw nothing
    fig, (ax_share, ax_q) = _new(ncols=2)
    ax_share.bar(centers, better, width, label="RL better", color="tab:green")
    ax_share.bar(centers, equal, width, bottom=better, label="tie", color="tab:gray")
    ax_share.bar(centers, worse, width, bottom=better + equal, label="RL worse", color="tab:red")
    ax_share.set(xlabel="normalised depth t / T_max", ylabel="share of states", ylim=(0, 1.05))
    ax_share.legend(fontsize=8)
    ax_q.plot(centers, np.asarray(mean_q_base_Db), marker="o", label="base")
    ax_q.plot(centers, np.asarray(mean_q_rl_Db), marker="o", label="RL")
    ax_q.set(xlabel="normalised depth t / T_max", ylabel="mean Q*")
    ax_q.legend()
    return _save(fig, path)


def likelihood_histograms(values: Mapping[str, np.ndarray], path, *, xlabel: str = "NLL under base (nats)",
                          bins: int = 30) -> str:
    """Overlaid density histograms (e.g. per-action NLL of RL vs base actions), common bin edges."""
    arrays = {k: np.asarray(v, np.float64).reshape(-1) for k, v in values.items()}
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays.values()] or [np.zeros(0)])
    if finite.size == 0:
        raise ValueError("likelihood_histograms needs at least one finite value")
    edges = np.histogram_bin_edges(finite, bins=bins)
    fig, (ax,) = _new()
    for label, a in arrays.items():
        ax.hist(a[np.isfinite(a)], bins=edges, density=True, alpha=0.5, label=f"{label} (mean {np.nanmean(a):.2f})")
    ax.set(xlabel=xlabel, ylabel="density")
    ax.legend()
    return _save(fig, path)


def training_dynamics(steps_It, r_multi_It, r_single_It, path) -> str:
    """R_multi and R_single over training steps (two y axes share the step axis)."""
    fig, (ax,) = _new()
    steps = np.asarray(steps_It)
    ax.plot(steps, np.asarray(r_multi_It), color="tab:blue", marker="o", label="R_multi")
    ax.set(xlabel="training step", ylabel="R_multi (trajectory success)")
    twin = ax.twinx()
    twin.plot(steps, np.asarray(r_single_It), color="tab:orange", marker="s", label="R_single")
    twin.set_ylabel("R_single (mass on Q*-optimal actions)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="best")
    return _save(fig, path)


LEARNING_CURVE_KEYS = (("success_rate", "training success rate"), ("valid_action_rate", "valid-action rate"),
                       ("kl", "KL to the base (k3 estimate)"), ("kl_exact", "KL to the base (exact)"),
                       ("entropy", "entropy (nats/token)"))


def learning_curves(per_seed: Mapping[str, Mapping[str, np.ndarray]], path, *, title: str = "",
                    keys=LEARNING_CURVE_KEYS, styles: Mapping[str, str] | None = None) -> str:
    """One panel per training-log key that any seed logged (success, valid-action rate, KL, entropy), one
    line per seed over iterations. per_seed: label -> {"iteration": [L], key: [L], ...}; styles: label ->
    matplotlib line style (e.g. ":" for a collapsed seed). Raises ValueError when no seed logged any key."""
    present = [(k, name) for k, name in keys if any(k in rec for rec in per_seed.values())]
    if not present:
        raise ValueError(f"learning_curves: no seed logged any of {[k for k, _ in keys]}")
    fig, axes = _new(ncols=len(present), width=3.6, height=3.2)
    for ax, (k, name) in zip(axes, present):
        for label, rec in per_seed.items():
            if k not in rec:
                continue
            y = np.asarray(rec[k], np.float64)
            x = np.asarray(rec.get("iteration", np.arange(y.size)), np.float64)
            ax.plot(x, y, (styles or {}).get(label, "-"), marker=".", label=label)
        ax.set(xlabel="RL iteration", title=name)
        if k in ("success_rate", "valid_action_rate"):
            ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def training_dynamics_seeds(per_seed: Mapping[str, tuple], path) -> str:
    """R_multi (left) and R_single (right) over training steps, one line per seed.
    per_seed: label -> (steps [L], r_multi [L], r_single [L]); non-finite values are not drawn."""
    if not per_seed:
        raise ValueError("training_dynamics_seeds needs at least one seed")
    fig, (ax_m, ax_s) = _new(ncols=2, width=4.5)
    for label, (steps, rm, rs) in per_seed.items():
        steps = np.asarray(steps, np.float64)
        for ax, y in ((ax_m, rm), (ax_s, rs)):
            y = np.asarray(y, np.float64)
            ok = np.isfinite(y)
            ax.plot(steps[ok], y[ok], marker="o", label=label)
    ax_m.set(xlabel="training step", ylabel="R_multi (trajectory success)", title="R_multi")
    ax_s.set(xlabel="training step", ylabel="R_single (mass on Q*-optimal actions)", title="R_single")
    ax_m.legend(fontsize=7)
    return _save(fig, path)

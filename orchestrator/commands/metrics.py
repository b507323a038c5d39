"""`orchestrator metrics JOB` and `orchestrator plot JOB --out FILE`: a run's metrics log.

JOB is a run name (its folder under --storage, default ./runs) or the path or URI of the run
folder (anything with a `/`). Both read the log while the job runs, from any storage.
"""

from __future__ import annotations

import argparse
import csv
import math
import posixpath
import sys
import time
from pathlib import Path

from core.records import is_eval, is_eval_field, is_train
from core.spec import CheckpointSpec

DEFAULT_STORAGE = CheckpointSpec().storage  # the spec's default checkpoint.storage
FIRST_COLUMNS = [
    "step",
    "loss",
    "lr",
    "samples_per_s",
    "tokens_per_s",
    "tflops_per_worker",
    "mfu",
    "grad_norm",
]
LABELS = {
    "lr": "lr",
    "samples_per_s": "samples/s",
    "tokens_per_s": "tokens/s",
    "tflops_per_worker": "TFLOP/s/worker",
    "mfu": "MFU",
}
PERCENT_FIELDS = ("mfu", "eval_accuracy")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="run name (its folder under --storage), or the run folder")
    parser.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        metavar="URI",
        help=f"checkpoint storage the run name is looked up in (default {DEFAULT_STORAGE})",
    )


def register(sub) -> None:
    parser = sub.add_parser("metrics", help="print a run's per-step metrics")
    _add_job_arguments(parser)
    parser.add_argument("--tail", type=_positive_int, metavar="N", help="only the last N records")
    parser.add_argument("--csv", action="store_true", help="CSV with every field, full precision")
    parser.set_defaults(handler=handle_metrics)

    parser = sub.add_parser("plot", help="draw a run's loss, learning-rate and throughput curves")
    _add_job_arguments(parser)
    parser.add_argument("--out", required=True, metavar="FILE", help="image file: .png, .svg or .pdf")
    parser.set_defaults(handler=handle_plot)


# -- reading -----------------------------------------------------------------------------------


class NoMetrics(Exception):
    """Printed as one line; exit status 2."""


def run_location(job: str, storage_uri: str) -> tuple[str, str, str]:
    """(run folder URI, run name, how to name it in a message)."""
    from core import storage

    if "://" in job or "/" in job:
        name = posixpath.basename(job.partition("?")[0].rstrip("/")) or job
        return job, name, f"at '{job}'"
    return storage.join(storage_uri, job), job, f"for '{job}' under {storage_uri}"


def _exists(uri: str) -> bool:
    from core import storage

    try:
        return storage.exists(uri)
    except OSError:  # unreachable: the reading error says more
        return True


def load_records(args) -> tuple[str, list[dict]]:
    """(run name, its records); NoMetrics when there are none to read."""
    import pyarrow as pa

    from core import metrics_log, storage

    run_uri, name, where = run_location(args.job, args.storage)
    try:
        return name, metrics_log.read_metrics(run_uri)
    except FileNotFoundError as err:
        if not _exists(run_uri):
            raise NoMetrics(f"no metrics {where}: {storage.resolve(run_uri)[1]} does not exist") from None
        raise NoMetrics(f"no metrics {where}: {err}") from None
    except (OSError, pa.ArrowException) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise NoMetrics(f"cannot read metrics {where}: {reason}") from None


def columns(records: list[dict]) -> list[str]:
    """Every field, in reading order: step, the usual training fields, other training fields,
    eval fields, time."""
    names = list(dict.fromkeys(k for r in records for k in r))
    first = [n for n in FIRST_COLUMNS if n in names]
    evals = [n for n in names if is_eval_field(n)]
    rest = [n for n in names if n not in first and n not in evals and n != "time"]
    return first + rest + evals + (["time"] if "time" in names else [])


# -- metrics -----------------------------------------------------------------------------------


def label(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    return name.replace("eval_", "eval ", 1).replace("_", " ")


def cell(name: str, value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if name == "time":
        return time.strftime("%m-%d %H:%M:%S", time.localtime(value))
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if name in PERCENT_FIELDS:
        return f"{value:.2%}"
    if name == "lr":
        return f"{value:.2e}"
    if name.endswith("_per_s"):
        return f"{value:,.0f}"
    if "loss" in name or name == "grad_norm":
        return f"{value:.4f}"
    return f"{value:.4g}"


def print_table(name: str, records: list[dict], total: int) -> None:
    from rich.console import Console
    from rich.table import Table

    steps = [r["step"] for r in records]
    shown = f"last {len(records)} of {total}" if len(records) < total else f"{total}"
    table = Table(title=f"{name}: {shown} records, steps {min(steps)}-{max(steps)}", title_justify="left")
    fields = columns(records)
    for field in fields:
        table.add_column(label(field), justify="left" if field == "time" else "right", no_wrap=True)
    for record in records:
        table.add_row(*(cell(f, record.get(f)) for f in fields), style="cyan" if is_eval(record) else None)
    # piped output: a table as wide as it needs, not cut to 80 columns
    console = Console() if sys.stdout.isatty() else Console(width=max(200, 14 * len(fields)))
    console.print(table)


def print_csv(records: list[dict], fields: list[str]) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(fields)
    for record in records:
        out.writerow(["" if record.get(f) is None else record[f] for f in fields])


def handle_metrics(args) -> int:
    try:
        name, records = load_records(args)
    except NoMetrics as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    shown = records[-args.tail :] if args.tail else records
    if args.csv:
        print_csv(shown, columns(records) or ["step"])
    elif not shown:
        print(f"{name}: no records yet")
    else:
        print_table(name, shown, len(records))
    return 0


# -- plot --------------------------------------------------------------------------------------


def smoothed(values: list[float], weight: float = 0.9) -> list[float]:
    """Exponential moving average, debiased (TensorBoard's smoothing)."""
    out, average = [], 0.0
    for i, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i))
    return out


def series(records: list[dict], field: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[field]) for r in records if isinstance(r.get(field), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def panels(records: list[dict]) -> list[tuple[str, list]]:
    """(title, [(label, field, style), ...]) of each panel the records have data for."""
    train = [r for r in records if not is_eval(r)]
    evals = [r for r in records if is_eval(r)]
    out = []
    loss = [("train", "loss", "train")] if any(is_train(r) for r in train) else []
    if any("eval_loss" in r for r in evals):
        loss.append(("eval", "eval_loss", "eval"))
    if loss:
        out.append(("loss", loss))
    if any("eval_accuracy" in r for r in evals):
        out.append(("eval accuracy", [("eval", "eval_accuracy", "eval")]))
    if any("lr" in r for r in train):
        out.append(("learning rate", [("lr", "lr", "plain")]))
    rate = "tokens_per_s" if any("tokens_per_s" in r for r in train) else "samples_per_s"
    if any(rate in r for r in train):
        out.append((label(rate), [(label(rate), rate, "rate")]))
    if any(isinstance(r.get("mfu"), (int, float)) for r in train):
        out.append(("MFU", [("MFU", "mfu", "rate")]))
    return out


def draw(name: str, records: list[dict], out: Path) -> list[str]:
    """Write the curves to `out`; returns the panel titles."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, FuncFormatter, PercentFormatter

    train = [r for r in records if not is_eval(r)]
    evals = [r for r in records if is_eval(r)]
    grid = panels(records)
    cols = {1: 1, 2: 2, 3: 3, 4: 2}.get(len(grid), 3)
    rows = math.ceil(len(grid) / cols)
    figure = Figure(figsize=(5.2 * cols, 3.6 * rows + 0.6), dpi=130, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False).ravel()
    for ax, (title, lines) in zip(axes, grid):
        for line_label, field, style in lines:
            steps, values = series(evals if style == "eval" else train, field)
            if style == "eval":
                ax.plot(
                    steps, values, "o-", color="tab:orange", markersize=4, linewidth=1.5, label=line_label
                )
            elif style in ("train", "rate") and len(values) > 30:  # noisy: raw faint, smoothed on top
                ax.plot(steps, values, color="tab:blue", alpha=0.25, linewidth=1)
                smooth_label = f"{line_label} (smoothed)" if style == "train" else None
                ax.plot(steps, smoothed(values), color="tab:blue", linewidth=1.8, label=smooth_label)
            else:
                ax.plot(steps, values, color="tab:blue", linewidth=1.8, label=line_label)
        ax.set_title(title, fontsize=11, loc="left")
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        field = lines[0][1]
        if field in PERCENT_FIELDS:
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        elif field.endswith("_per_s"):
            ax.yaxis.set_major_formatter(EngFormatter())
        elif field == "lr":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
        if lines[0][2] in ("rate", "plain"):  # rates and the schedule read best against zero
            ax.set_ylim(bottom=0)
        if len(lines) > 1 or lines[0][2] == "train":
            ax.legend(frameon=False, fontsize=9)
    for ax in axes[len(grid) :]:
        ax.set_visible(False)
    figure.suptitle(f"{name}  ·  {subtitle(train, evals)}", fontsize=13, x=0.01, ha="left")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return [title for title, _ in grid]


def subtitle(train: list[dict], evals: list[dict]) -> str:
    steps = [r["step"] for r in train + evals]
    parts = [f"steps {min(steps)}-{max(steps)}"]
    losses = [r["loss"] for r in train if isinstance(r.get("loss"), (int, float))]
    if losses:
        parts.append(f"final loss {losses[-1]:.4f}")
    accuracies = [r["eval_accuracy"] for r in evals if isinstance(r.get("eval_accuracy"), (int, float))]
    if accuracies:
        parts.append(f"eval accuracy {accuracies[-1]:.2%}")
    return "  ·  ".join(parts)


def handle_plot(args) -> int:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(args.out)
    formats = FigureCanvasAgg(Figure()).get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in formats:
        print(f"error: --out {args.out}: the file name must end in .png, .svg or .pdf", file=sys.stderr)
        return 2
    try:
        name, records = load_records(args)
    except NoMetrics as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not panels(records):
        print(f"error: nothing to plot for '{args.job}': no training records yet", file=sys.stderr)
        return 2
    titles = draw(name, records, out)
    print(f"wrote {out}: {', '.join(titles)} ({len(records)} records)")
    return 0

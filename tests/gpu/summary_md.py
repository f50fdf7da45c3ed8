"""summary.md of a GPU acceptance run: the document ``tests/gpu/summarise.py`` builds, as Markdown tables."""

from __future__ import annotations

from typing import Any


def _cell(value: Any, fmt: str = "{}") -> str:
    return "" if value is None or value == "" else fmt.format(value).replace("|", "/")


def render_md(s: dict[str, Any]) -> str:
    """summary.md: the steps, the figures against the datasheet, verify, tests and findings."""
    m = s["machine"]
    gpus = ", ".join(sorted(set(m["gpus"]))) or "no GPU"
    lines = [
        "# GPU acceptance run",
        "",
        f"{len(m['gpus'])} x {gpus}; driver {m['driver'] or '?'}; torch {m['torch'] or '?'} (CUDA {m['torch_cuda'] or '?'})",
        "",
        "## Steps",
        "",
        "| step | status | exit | seconds | timeout | note |",
        "|---|---|---|---|---|---|",
    ]
    for st in s["steps"]:
        row = (st["name"], st["status"], _cell(st["rc"]), _cell(st["seconds"]), st["timeout_s"], _cell(st["note"]))
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    lines += [
        "",
        "## Figures against the datasheet",
        "",
        "| source | GPU | figure | measured | datasheet | fraction | note |",
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for f in s["figures"]:
        measured, sheet = f"{f['value']:.1f} {f['unit']}", _cell(f["datasheet"], "{:g} " + f["unit"])
        fraction = _cell(f["fraction"], "{:.0%}") or "no datasheet figure"
        lines.append(
            f"| {f['source']} | {f['gpu']} | {f['metric']} | {measured} | {sheet} | {fraction} | {_cell(f['note'])} |"
        )
    lines += [
        "",
        "## verify",
        "",
        "| run | device | precision | batch | samples/s | median step s | MFU | verdict | GPU samples |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for v in s["verify"]:
        row = (v["run"], v["device"], v["precision"], v["batch_size"], v["samples_per_s"], v["median_step_s"])
        cells = [_cell(c, "{:.4g}" if isinstance(c, float) else "{}") for c in row]
        lines.append(
            "| " + " | ".join([*cells, _cell(v["mfu"], "{:.1%}"), _cell(v["verdict"]), _cell(v["gpu_samples"])]) + " |"
        )
    tests = s["gpu_tests"]
    lines += ["", "## GPU-marked tests", ""]
    if tests is None:
        lines.append("no results (gpu-tests.xml is missing)")
    else:
        lines.append(", ".join(f"{n} {k}" for k, n in tests["counts"].items()))
        lines += [f"- {c['outcome']} {c['name']}: {c['message']}" for c in tests["cases"] if c["outcome"] != "passed"]
    lines += ["", "## Findings (fail, warn and error results)", ""]
    lines += [f"- {f}" for f in s["findings"]] or ["none"]
    lines += ["", "## Not covered by this checkout", ""] + [f"- {n}" for n in s["not_covered"]]
    return "\n".join(lines) + "\n"

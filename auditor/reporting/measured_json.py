"""`--output-format json` of `loopaudit run` and `loopaudit analyze` (documented in
docs/dynamic-mode.md). Findings have the scan's shape plus `observed`; times are milliseconds and
fractions are shares of the measured steps' time, from 0 to 1."""

from __future__ import annotations

import json
from typing import TextIO

from loopaudit.profiling.in_loopaudit.audit import RunAudit, display_path
from loopaudit.profiling.in_loopaudit.breakdown import Breakdown
from loopaudit.profiling.in_loopaudit.compare import Comparison
from loopaudit.profiling.in_loopaudit.job import JobAudit, TraceJob
from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis
from loopaudit.reporting.safe_text import json_ready


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _estimate(estimate, digits: int) -> dict | None:
    """{"value", "low", "high", "steps"}: the 95% interval's ends are null when too few steps gave none."""
    if estimate is None:
        return None
    return {
        "value": round(estimate.value, digits),
        "low": _rounded(estimate.low, digits),
        "high": _rounded(estimate.high, digits),
        "steps": estimate.steps,
    }


def _steps(breakdown: Breakdown) -> dict:
    return {
        "steps_measured": len(breakdown.rows),
        "step_time_ms": breakdown.step_time_ms,
        "data_wait_fraction": _rounded(breakdown.share("data_wait")),
        "sync_stall_fraction": _rounded(breakdown.share("sync_stall")),
        "steps": [
            {
                **row.to_json(breakdown.data_measured, breakdown.sync_measured),
                "transient": row.label in breakdown.transient,
            }
            for row in breakdown.rows
        ],
    }


def run_document(audit: RunAudit, breakdown: Breakdown, script: str, arguments: list[str], status: dict) -> dict:
    report = audit.evidence.report
    trace = audit.evidence.trace
    document = {
        "script": script,
        "arguments": arguments,
        "device": report.device,
        "cuda": report.cuda,
        "torch": report.torch_version,
        **status,
        "step_kind": report.step_kind,
        "warmup": report.warmup,
        "max_steps": report.longest,
        **_steps(breakdown),
        "estimates": {
            "step_time_ms": _estimate(breakdown.step_time, 3),
            "data_wait_not_ready_fraction": _estimate(breakdown.data_not_ready, 4),
        },
        "transient": (
            {
                "steps": sorted(breakdown.transient, key=int),
                "slow_ms": round(transient.slow_ms, 3),
                "steady_ms": round(transient.steady_ms, 3),
            }
            if (transient := audit.evidence.transient) is not None
            else None
        ),
        "gpu_idle_fraction": _rounded(trace.gpu_idle_fraction) if trace else None,
        "sync_sites": [
            {
                "filename": site.filename,
                "line": site.record.line,
                "kind": site.record.kind,
                "call": site.record.call,
                "via": site.record.via,
                "per_step": audit.evidence.per_step(site.record.count),
                "total": site.record.count,
                "steps": site.record.steps,
                "time_ms": round(site.record.seconds * 1000, 3) if report.cuda else None,
                "on_step_path": site.on_step_path,
                "static": site.static_codes,
            }
            for site in audit.sites
        ],
        "loaders": [
            {
                "filename": display_path(loader.file) if loader.file else None,
                "line": loader.line,
                "dataset": loader.dataset,
                "batch_size": loader.batch_size,
                "num_workers": loader.num_workers,
                "pin_memory": loader.pin_memory,
                "persistent_workers": loader.persistent_workers,
                "prefetch_factor": loader.prefetch_factor,
                "batches": loader.batches,
                "wait_ms": round(loader.wait_seconds * 1000, 3),
            }
            for loader in report.loaders
        ],
        "trace": report.trace,
        "findings": [finding.to_json() for finding in audit.findings],
        "undecided": [{"code": code, "message": message} for code, message in audit.undecided],
        "static": [check.to_json() for check in audit.static],
    }
    return document


def trace_document(analysis: TraceAnalysis, breakdown: Breakdown, findings) -> dict:
    return {
        "trace": analysis.path,
        "device": analysis.device,
        **_steps(breakdown),
        "gpu_idle_fraction": _rounded(analysis.gpu_idle_fraction),
        "syncs": [
            {
                "call": site.call,
                "operator": site.operator,
                "frame": str(site.frame) if site.frame else None,
                "count": site.count,
                "steps": site.steps,
                "stall_ms": round(site.stall_us / 1000, 3) if site.proven else None,
                "proven": site.proven,
            }
            for site in analysis.syncs
        ],
        "pageable_copies": [
            {
                "kind": copy.kind,
                "operator": copy.operator,
                "frame": str(copy.frame) if copy.frame else None,
                "count": copy.count,
                "bytes": copy.bytes,
                "time_ms": round(copy.duration_us / 1000, 3),
            }
            for copy in analysis.copies
        ],
        "allocator": {
            "calls": analysis.allocator_calls,
            "time_ms": round(analysis.allocator_us / 1000, 3),
            "steps_freeing": analysis.steps_freeing,
        },
        "findings": [finding.to_json() for finding in findings],
    }


def comparison_document(comparison: Comparison) -> dict:
    """`loopaudit compare --output-format json`: each change with its interval, verdict and limit."""
    return {
        "before": comparison.before,
        "after": comparison.after,
        "changes": [
            {
                "metric": change.metric,
                "label": change.label,
                "before": _rounded(change.before),
                "after": _rounded(change.after),
                "change": _rounded(change.change),
                "interval": [_rounded(change.low), _rounded(change.high)] if change.low is not None else None,
                "verdict": change.verdict,
                "limit": change.limit,
                "failed": change.failed,
            }
            for change in comparison.changes
        ],
        "failed": [change.label for change in comparison.failed],
        "notes": comparison.notes,
    }


def write(document: dict, out: TextIO) -> None:
    """As valid JSON whatever the trace or the script's paths hold (safe_text.json_ready)."""
    json.dump(json_ready(document), out, indent=2)
    out.write("\n")


def job_document(job: JobAudit, script: str, arguments: list[str], world_size: int) -> dict:
    """`loopaudit run --nproc-per-node N --output-format json`."""
    return {
        "script": script,
        "arguments": arguments,
        "world_size": world_size,
        "ranks": [
            {
                "rank": view.rank,
                "status": view.status,
                "failed": view.failed,
                "exit_status": view.outcome.outcome.status,
                "stuck_after_rank": view.outcome.stuck_after,
                "steps_measured": view.steps,
                "step_time_ms": _estimate(view.step_ms, 3),
                "data_wait_ms": _estimate(view.data_wait_ms, 3),
                "comm_wait_ms": _estimate(view.comm_ms, 3),
                "collectives_per_step": view.collectives_per_step,
                "device": view.evidence.report.device if view.evidence else None,
            }
            for view in job.ranks
        ],
        "straggler": {"rank": job.straggler, "reason": job.straggler_reason},
        "imbalance": _rounded(job.imbalance),
        "collectives": [
            {
                "filename": display_path(entry.file),
                "line": entry.line,
                "call": entry.call,
                "via": entry.via,
                "per_step": entry.per_step,
                "time_ms_per_step": entry.ms_per_step,
            }
            for entry in job.collectives
        ],
        "findings": [finding.to_json() for finding in job.findings],
        "static": [check.to_json() for check in job.static],
    }


def trace_job_document(job: TraceJob, folder: str) -> dict:
    """`loopaudit analyze DIR --output-format json`."""
    return {
        "folder": folder,
        "world_size": len(job.ranks),
        "ranks": [
            {
                "rank": rank.rank,
                "trace": rank.analysis.path,
                "device": rank.analysis.device,
                "steps": rank.steps,
                "step_time_ms": _estimate(rank.step_ms, 3),
                "data_wait_ms": _estimate(rank.data_wait_ms, 3),
                "comm_wait_ms": _estimate(rank.comm_ms, 3),
                "gpu_idle_fraction": _rounded(rank.analysis.gpu_idle_fraction),
            }
            for rank in job.ranks
        ],
        "straggler": {"rank": job.straggler, "reason": job.straggler_reason},
        "imbalance": _rounded(job.imbalance),
        "findings": [finding.to_json() for finding in job.findings],
    }

"""cyclone: durable DAG workflows and background jobs on PostgreSQL, with idempotent submission."""

from __future__ import annotations

from importlib.metadata import version as _version

from cyclone import errors
from cyclone.client import Client
from cyclone.connections import close, configure
from cyclone.context import StepContext
from cyclone.errors import (
    CycloneError,
    DefinitionError,
    DuplicateError,
    InputError,
    InvalidKeyError,
    InvalidStateError,
    NoOutputError,
    NotFoundError,
    RunFailedError,
    SchemaError,
    SubmitConflictError,
    TransactionAbortedError,
)
from cyclone.jobs import Job, JobStatus
from cyclone.limits import Concurrency, Rate
from cyclone.migrations import check_schema, downgrade, upgrade
from cyclone.runs import ResultRun, Run, RunStatus
from cyclone.schedules import Schedule, ScheduleStatus
from cyclone.states import JobState, Parked, RunState
from cyclone.worker import Worker, WorkerStats
from cyclone.workflow import ResultWorkflow, StandaloneStep, Step, Workflow, step

__version__ = _version("cyclone")

__all__ = [
    "Client",
    "Concurrency",
    "CycloneError",
    "DefinitionError",
    "DuplicateError",
    "InputError",
    "InvalidKeyError",
    "InvalidStateError",
    "Job",
    "JobState",
    "JobStatus",
    "NoOutputError",
    "NotFoundError",
    "Parked",
    "Rate",
    "ResultRun",
    "ResultWorkflow",
    "Run",
    "RunFailedError",
    "RunState",
    "RunStatus",
    "Schedule",
    "ScheduleStatus",
    "SchemaError",
    "StandaloneStep",
    "Step",
    "StepContext",
    "SubmitConflictError",
    "TransactionAbortedError",
    "Worker",
    "WorkerStats",
    "Workflow",
    "__version__",
    "check_schema",
    "close",
    "configure",
    "downgrade",
    "errors",
    "step",
    "upgrade",
]

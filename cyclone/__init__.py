"""cyclone: durable DAG workflows and background jobs on PostgreSQL, with idempotent submission."""

from __future__ import annotations

import logging as _logging
from importlib.metadata import version as _version

from cyclone import errors
from cyclone.client import Client, WorkerStatus
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

# A library configures no logging: without this handler, the standard library's
# "last resort" handler would print cyclone's WARNING and ERROR records (a retried step,
# a failed step with its traceback) to stderr of an application that configured none.
# Records still propagate to the handlers an application sets up.
_logging.getLogger("cyclone").addHandler(_logging.NullHandler())

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
    "WorkerStatus",
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

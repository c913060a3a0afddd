"""Definitions: ``Workflow``, ``ResultWorkflow``, their steps, and standalone ``@step`` kinds.

Defining touches no database. Validation happens as the definitions are written: a
duplicate step name, an unknown dependency, a cycle or a second result node raises
:class:`~cyclone.errors.DefinitionError`.
"""

from __future__ import annotations

import inspect
import typing
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload

from cyclone import _graph, _keys, _timing, errors, jobs, limits, schedules
from cyclone._store import binds as _binds
from cyclone._store import children as _children
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits_store
from cyclone._store import lookup as _lookup
from cyclone._store import submission
from cyclone._store import waits as _waits
from cyclone.runs import ResultRun, Run
from cyclone.schema import MAX_INTEGER

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from cyclone._store.binds import Bind, Conn
    from cyclone.context import StepContext

In = TypeVar("In")
Out = TypeVar("Out")
R = TypeVar("R")

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_QUEUE = "default"

StepFn = Callable[["StepContext", Any], Any]


def _return_type(fn: Callable[..., Any]) -> Any:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations fall back to untyped JSON
        return Any
    ret = hints.get("return", Any)
    return Any if ret is type(None) else ret


def _arg_type(fn: Callable[..., Any]) -> Any:
    params = list(inspect.signature(fn).parameters)
    if len(params) < 2:
        return Any
    try:
        return typing.get_type_hints(fn).get(params[1], Any)
    except Exception:
        return Any


MAX_NAME_LENGTH = 200
"""The longest workflow, step, queue or step-kind name, in characters."""


def check_name(what: str, name: object) -> str:
    """Return ``name`` if it is a valid name, else raise DefinitionError (at definition).

    A name is a non-empty str of valid UTF-8 (no lone surrogates), without NUL (which
    PostgreSQL's text cannot hold), at most :data:`MAX_NAME_LENGTH` characters.
    """
    if not isinstance(name, str) or not name:
        raise errors.DefinitionError(f"{what} must be a non-empty str, not {name!r}")
    why = _keys.unstorable(name)
    if why is not None:
        raise errors.DefinitionError(f"{what} {name!r} {why}")
    if len(name) > MAX_NAME_LENGTH:
        raise errors.DefinitionError(
            f"{what} is {len(name)} characters long, at most {MAX_NAME_LENGTH} allowed"
        )
    return name


def _check_options(where: str, max_attempts: int, queue: str, priority: int) -> None:
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_INTEGER
    ):
        raise errors.DefinitionError(
            f"{where}: max_attempts must be an int from 1 to {MAX_INTEGER}, not {max_attempts!r}"
        )
    check_name(f"{where}: queue", queue)
    # A bool is an int to Python, but PostgreSQL cannot cast it to smallint: enqueue(...,
    # priority=True) failed in the driver.
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -32768 <= priority <= 32767
    ):
        raise errors.DefinitionError(f"{where}: priority must be an int in the smallint range")


def _check_overrides(where: str, max_attempts: object, queue: object, priority: object) -> None:
    """An enqueue's ``max_attempts=``, ``queue=`` and ``priority=`` (None: the kind's):
    TypeError or ValueError before anything is written, as every call's arguments; the
    same rules as :func:`_check_options` gives a definition."""
    for what, value, low, high in (
        ("max_attempts", max_attempts, 1, MAX_INTEGER),
        ("priority", priority, -32768, 32767),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}: {what}= takes an int, not {type(value).__name__}")
        if not low <= value <= high:
            raise ValueError(f"{where}: {what}= must be from {low} to {high}, not {value}")
    if queue is not None:
        if not isinstance(queue, str):
            raise TypeError(f"{where}: queue= takes a str, not {type(queue).__name__}")
        try:
            check_name(f"{where}: queue", queue)
        except errors.DefinitionError as exc:
            raise ValueError(str(exc)) from None


def _check_definition_duration(where: str, what: str, value: timedelta) -> None:
    """A sleep's duration or a wait's timeout past :data:`cyclone._timing.MAX_DURATION` is a
    DefinitionError: a worker reaching the node computed a time PostgreSQL or Python cannot
    hold, and handed the node back forever."""
    try:
        _timing.check_duration(value, what)
    except ValueError as exc:
        raise errors.DefinitionError(f"{where}: {exc}") from None


class Step(Generic[R]):
    """One node of a workflow: a function ``fn(ctx, input) -> output`` and its options."""

    def __init__(
        self,
        workflow: Workflow[Any],
        fn: Callable[..., R],
        *,
        name: str,
        after: tuple[str, ...],
        max_attempts: int,
        queue: str,
        priority: int,
        is_result: bool,
        signal: str | None = None,
        timeout: timedelta | None = None,
        sleep: timedelta | None = None,
        output: Any = None,
        child: Workflow[Any] | None = None,
        over: str | None = None,
        limit: limits.Spec | None = None,
    ) -> None:
        self.workflow = workflow
        self.fn = fn
        self.name = name
        self.after = after
        self.max_attempts = max_attempts
        self.queue = queue
        self.priority = priority
        self.is_result = is_result
        self.output_type: Any = _return_type(fn) if output is None else output
        self.signal = signal
        """The signal a wait node waits for (``@wf.wait``); None for other steps."""
        self.timeout = timeout
        self.sleep = sleep
        """How long a sleep node waits after its upstreams (``@wf.sleep``); None otherwise."""
        self.payload_type: Any = _arg_type(fn) if signal is not None else Any
        self.child = child
        """The workflow a child node submits its return value as a run of (``@wf.child``)."""
        self.produces: Any = self.output_type
        """The type ``fn``'s return value is encoded as: its output's, or a child's input's."""
        if child is not None:
            self.produces = child.input_type
            self.output_type = getattr(child, "output_type", type(None))
        self._child_spec: _children.Child | None = None
        self.over = over
        """The node a map node (``@wf.map``) maps over; None for other steps."""
        self.item_type: Any = _arg_type(fn) if over is not None else Any
        item_output: Any = self.output_type
        self.item_output_type: Any = item_output
        """What each item of a map node returns; the node's own output is a list of them."""
        if over is not None:
            self.output_type = list[item_output]
        self.limit = limit
        """The step's Concurrency or Rate (``@wf.step(concurrency=|rate=)``), its key a
        function of the run's input; a map node's bounds its items, not the node's own job.
        None: unlimited."""
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, ctx: StepContext, value: Any) -> R:
        return self.fn(ctx, value)

    def __repr__(self) -> str:
        return f"<Step {self.workflow.name}.{self.name}>"

    def child_spec(self) -> _children.Child:
        """How a worker submits this child node's child (its plan and limit key), cached."""
        assert self.child is not None
        if self._child_spec is None:
            wf = self.child

            def limit_key(encoded: str) -> submission.LimitKeys | None:
                if wf.limit is None and not wf._limited_steps():
                    return None
                from cyclone import _codec

                return wf._limit_key(_codec.decode(encoded, wf.input_type))

            self._child_spec = _children.Child(wf.plan(), limit_key)
        return self._child_spec

    def snapshot(self) -> _graph.NodeSnapshot:
        return _graph.NodeSnapshot(
            name=self.name,
            after=self.after,
            max_attempts=self.max_attempts,
            queue=self.queue,
            priority=self.priority,
            signal=self.signal,
            sleep=self.sleep,
            over=self.over,
        )


class Workflow(Generic[In]):
    """A named DAG of steps; each submit makes one run of it.

    Args:
        name: the workflow name; submit keys are unique per name.
        input: the input type (anything msgspec encodes and decodes).
        queue: the default queue of its steps.
        concurrency: a :class:`~cyclone.Concurrency` bounding its runs in progress per key,
            across every worker (see docs/flow-control.md).
    """

    _has_result = False

    # The overloads let a type checker infer ``In`` from ``input=``: with the one signature
    # below (``type[In] | Any``) mypy could not, and ``wf = Workflow("w", input=Order)``
    # needed an annotation under --strict. Without ``input=`` (or with a value that is not
    # a class, such as ``int | None``) the workflow is a ``Workflow[Any]``.
    @overload
    def __init__(
        self: Workflow[In],
        name: str,
        *,
        input: type[In],
        queue: str = ...,
        concurrency: limits.Concurrency | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self: Workflow[Any],
        name: str,
        *,
        input: Any = ...,
        queue: str = ...,
        concurrency: limits.Concurrency | None = ...,
    ) -> None: ...

    def __init__(
        self,
        name: str,
        *,
        input: type[In] | Any = Any,
        queue: str = DEFAULT_QUEUE,
        concurrency: limits.Concurrency | None = None,
    ) -> None:
        check_name("a workflow name", name)
        _check_options(f"workflow {name!r}", DEFAULT_MAX_ATTEMPTS, queue, 0)
        if concurrency is not None and not isinstance(concurrency, limits.Concurrency):
            raise errors.DefinitionError(
                f"workflow {name!r}: concurrency= takes a cyclone.Concurrency"
            )
        self.limit: limits.Spec | None = limits.resolve(concurrency, f"workflow:{name}", "runs")
        self.name = name
        self.input_type: Any = input
        self.queue = queue
        self.steps: dict[str, Step[Any]] = {}
        self._result: str | None = None
        self._plan: submission.Plan | None = None
        self._signals: dict[str, Any] | None = None
        self.schedules: dict[str, schedules.Schedule] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} steps={list(self.steps)}>"

    def step(
        self,
        name: str | None = None,
        *,
        after: Iterable[Step[Any] | str] = (),
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        queue: str | None = None,
        priority: int = 0,
        concurrency: limits.Concurrency | None = None,
        rate: limits.Rate | None = None,
    ) -> Callable[[Callable[..., R]], Step[R]]:
        """Decorate ``fn(ctx, input) -> output`` as a step that runs after the steps in ``after``.

        ``max_attempts`` bounds the tries of a step that raises; ``queue`` and ``priority``
        (lower runs first) place its jobs. ``concurrency`` bounds its running attempts,
        ``rate`` its attempt starts, per key across every worker; their ``key`` is a
        function of the run's input (the step's input), evaluated at submit time and kept
        with the run (see docs/flow-control.md).
        """
        return self._limited(
            f"a step of workflow {self.name!r}",
            name,
            concurrency,
            rate,
            lambda spec: self._decorator(
                name, after, max_attempts, queue, priority, is_result=False, limit=spec
            ),
        )

    def _limited(
        self,
        where: str,
        name: str | None,
        concurrency: limits.Concurrency | None,
        rate: limits.Rate | None,
        make: Callable[[limits.Spec | None], Callable[[Callable[..., R]], Step[R]]],
    ) -> Callable[[Callable[..., R]], Step[R]]:
        """The decorator ``make`` gives for the limit of ``concurrency`` and ``rate``
        (checked now, before the function is known), named ``step:<workflow>.<node>``
        unless named."""
        if concurrency is None and rate is None:
            return make(None)
        _check_step_limits(where, concurrency, rate)

        def decorate(fn: Callable[..., R]) -> Step[R]:
            step_name = fn.__name__ if name is None else name
            default = f"step:{self.name}.{step_name}"
            return make(limits.resolve_pair(concurrency, rate, default))(fn)

        return decorate

    def wait(
        self,
        signal: str,
        *,
        after: Iterable[Step[Any] | str] = (),
        timeout: timedelta | None = None,
        output: Any = None,
        name: str | None = None,
        max_attempts: int = 1,
        queue: str | None = None,
        priority: int = 0,
    ) -> Callable[[Callable[..., R]], Step[R]]:
        """Decorate ``fn(ctx, payload) -> output`` as a node that runs when ``signal`` arrives.

        It runs once its upstreams completed and the signal was sent to the run
        (:meth:`signal`, before or after the node is reached), with the signal's payload
        decoded to ``fn``'s annotation; its return value is its output, decoded by
        ``ctx.output(node)`` downstream to ``fn``'s return annotation or ``output``.
        While it waits, the run holds no worker and no connection. ``timeout``: the node
        fails with "timed out waiting for <signal>" when no signal came that long after
        a worker first reached it (retried as any step up to ``max_attempts``, 1 by
        default, each attempt waiting anew).
        """
        where = f"wait node for {signal!r} of workflow {self.name!r}"
        if not isinstance(signal, str) or not signal:
            raise errors.DefinitionError(f"{where}: the signal name is a non-empty str")
        # The name is stored in the run's graph (jsonb) and with each signal (text): a NUL
        # or a lone surrogate made every submit of the workflow fail in the driver or the
        # encoder, after the definition was accepted.
        why = _keys.unstorable(signal)
        if why is not None:
            raise errors.DefinitionError(f"{where}: the signal name {why}")
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta()):
            raise errors.DefinitionError(f"{where}: timeout= takes a positive timedelta")
        if timeout is not None:
            _check_definition_duration(where, "timeout=", timeout)
        return self._decorator(
            name,
            after,
            max_attempts,
            queue,
            priority,
            is_result=False,
            signal=signal,
            timeout=timeout,
            output=output,
        )

    def sleep(
        self,
        duration: timedelta,
        *,
        after: Iterable[Step[Any] | str] = (),
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        queue: str | None = None,
        priority: int = 0,
    ) -> Callable[[Callable[..., R]], Step[R]]:
        """Decorate a step that starts no earlier than ``duration`` after its upstreams
        completed (after the submit, for a root). Durable: the wait survives restarts
        and holds no worker and no connection."""
        if not isinstance(duration, timedelta) or duration < timedelta():
            raise errors.DefinitionError(
                f"sleep of workflow {self.name!r}: duration takes a non-negative timedelta"
            )
        _check_definition_duration(f"sleep of workflow {self.name!r}", "duration", duration)
        return self._decorator(
            name, after, max_attempts, queue, priority, is_result=False, sleep=duration
        )

    def child(
        self,
        workflow: Workflow[Any],
        *,
        over: Step[Any] | str | None = None,
        after: Iterable[Step[Any] | str] = (),
        name: str | None = None,
        max_attempts: int = 1,
        queue: str | None = None,
        priority: int = 0,
        concurrency: limits.Concurrency | None = None,
        rate: limits.Rate | None = None,
    ) -> Callable[[Callable[..., Any]], Step[Any]]:
        """Decorate ``fn(ctx, input) -> ChildInput`` as a node that runs a child workflow.

        Its return value is submitted as a run of ``workflow``, exactly once per node of
        each run (``submit_once`` under a key made of this run's id and the node's name,
        in the transaction that parks the node). The node waits for the child holding no
        worker; its output (``ctx.output(node)`` downstream) is the child's result for a
        :class:`ResultWorkflow`, else None. A failed or cancelled child fails the node,
        naming the child run; a later attempt of the node (``max_attempts``, 1 by default,
        or a retry of this run) retries the child. ``concurrency`` and ``rate`` bound the
        node's attempts as a step's (a parked node holds no slot). See docs/children.md.

        With ``over=node`` it is a *map of children*: ``fn(ctx, item) -> ChildInput`` runs
        once per item of the list ``node`` returned (each item a job, as a map's, with the
        limits), each item's return value submitted as one child run (keyed by this run's
        id, the node's name and the item's index), and the node's output is the ordered
        list of the children's results (None each for a plain :class:`Workflow`).
        """
        if not isinstance(workflow, Workflow):
            raise errors.DefinitionError(
                f"child node of workflow {self.name!r}: the first argument is a Workflow "
                f"or ResultWorkflow, not {workflow!r}"
            )
        if workflow is self:
            raise errors.DefinitionError(
                f"child node of workflow {self.name!r}: a workflow cannot be its own child"
            )
        deps: tuple[str, ...] = tuple(self._dep_name(dep) for dep in after)
        over_name: str | None = None
        if over is not None:
            over_name = self._dep_name(over)
            if over_name in deps:
                raise errors.DefinitionError(
                    f"child node of workflow {self.name!r}: {over_name!r} is given as over= "
                    "and in after=; over= is an upstream already"
                )
            deps = (*deps, over_name)
        return self._limited(
            f"child node of workflow {self.name!r}",
            name,
            concurrency,
            rate,
            lambda spec: self._decorator(
                name,
                deps,
                max_attempts,
                queue,
                priority,
                is_result=False,
                child=workflow,
                over=over_name,
                limit=spec,
            ),
        )

    def map(
        self,
        over: Step[Any] | str,
        *,
        after: Iterable[Step[Any] | str] = (),
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        queue: str | None = None,
        priority: int = 0,
        result: bool = False,
        concurrency: limits.Concurrency | None = None,
        rate: limits.Rate | None = None,
    ) -> Callable[[Callable[..., R]], Step[list[R]]]:
        """Decorate ``fn(ctx, item) -> output`` as a map node: once ``over`` completed with a
        list, it runs once per item, each item a job of its own (its own attempts, claimed
        in parallel by every worker), the item decoded to ``fn``'s annotation.

        Its output, ``ctx.output(node)`` downstream, is the list of the items' outputs in
        the list's order; an empty list completes it at once. An item that fails after its
        attempts fails the node and the run; ``run.retry()`` re-runs only the failed items.
        The options apply to each item's job (see docs/map.md): ``concurrency`` bounds the
        items running at once, ``rate`` the item starts per window, per key (a function of
        the run's input, as a step's). ``result=True`` makes it a
        ``ResultWorkflow``'s result node: the run's result is the list.
        """
        if result and not self._has_result:
            raise errors.DefinitionError(
                f"map node of workflow {self.name!r}: result=True needs a ResultWorkflow"
            )
        over_name = self._dep_name(over)
        deps = tuple(self._dep_name(dep) for dep in after)
        if over_name in deps:
            raise errors.DefinitionError(
                f"map node of workflow {self.name!r}: {over_name!r} is given as over= "
                "and in after=; over= is an upstream already"
            )
        decorate = self._limited(
            f"map node of workflow {self.name!r}",
            name,
            concurrency,
            rate,
            lambda spec: self._decorator(
                name,
                (*deps, over_name),
                max_attempts,
                queue,
                priority,
                is_result=result,
                over=over_name,
                limit=spec,
            ),
        )
        # Its output (``ctx.output(node)``) is the list of the items' outputs.
        return cast("Callable[[Callable[..., R]], Step[list[R]]]", decorate)

    def _decorator(
        self,
        name: str | None,
        after: Iterable[Step[Any] | str],
        max_attempts: int,
        queue: str | None,
        priority: int,
        *,
        is_result: bool,
        **kinds: Any,
    ) -> Callable[[Callable[..., R]], Step[R]]:
        if callable(name):
            raise errors.DefinitionError(
                f"use @{self.name}.step() with parentheses, not @{self.name}.step"
            )
        deps = tuple(self._dep_name(dep) for dep in after)

        def decorate(fn: Callable[..., R]) -> Step[R]:
            given = fn.__name__ if name is None else name
            step_name = check_name(f"a step name of workflow {self.name!r}", given)
            where = f"step {step_name!r} of workflow {self.name!r}"
            if step_name in self.steps:
                raise errors.DefinitionError(f"{where} is defined twice")
            if len(set(deps)) != len(deps):
                raise errors.DefinitionError(f"{where} names a step twice in after=")
            if step_name in deps:
                raise errors.DefinitionError(f"{where} comes after itself")
            step_queue = self.queue if queue is None else queue
            _check_options(where, max_attempts, step_queue, priority)
            if is_result and self._result is not None:
                raise errors.DefinitionError(
                    f"workflow {self.name!r} has a result node already ({self._result!r}); "
                    f"{step_name!r} cannot be a second one"
                )
            node = Step(
                self,
                fn,
                name=step_name,
                after=deps,
                max_attempts=max_attempts,
                queue=step_queue,
                priority=priority,
                is_result=is_result,
                **kinds,
            )
            if node.signal is not None:
                for other in self.steps.values():
                    if other.signal == node.signal:
                        raise errors.DefinitionError(
                            f"{where} waits for {other.signal!r}, as step {other.name!r} does; "
                            "one wait node per signal"
                        )
            # Check for a cycle before keeping the step, so a rejected step leaves no trace.
            candidate = {name_: node_.after for name_, node_ in self.steps.items()}
            candidate[step_name] = deps
            if all(dep in candidate for after_ in candidate.values() for dep in after_):
                _graph.topological_order(self.name, candidate)
            self.steps[step_name] = node
            if is_result:
                self._result = step_name
            self._plan = None
            self._signals = None
            return node

        return decorate

    def _dep_name(self, dep: Step[Any] | str) -> str:
        if isinstance(dep, Step):
            if dep.workflow is not self:
                raise errors.DefinitionError(
                    f"step {dep.name!r} belongs to workflow {dep.workflow.name!r}, "
                    f"not to {self.name!r}"
                )
            return dep.name
        if isinstance(dep, str):
            return dep
        raise errors.DefinitionError(f"after= takes steps or step names, not {dep!r}")

    def _order(self) -> list[str]:
        return _graph.topological_order(
            self.name, {name: node.after for name, node in self.steps.items()}
        )

    def graph(self) -> _graph.GraphSnapshot:
        """The graph as a run submitted now would keep it (validated)."""
        if not self.steps:
            raise errors.DefinitionError(f"workflow {self.name!r} has no steps")
        if self._has_result and self._result is None:
            raise errors.DefinitionError(
                f"ResultWorkflow {self.name!r} has no result node: decorate one with "
                f"@{self.name}.result()"
            )
        order = self._order()
        return _graph.GraphSnapshot(
            steps=tuple(self.steps[name].snapshot() for name in order), result=self._result
        )

    def plan(self) -> submission.Plan:
        """The validated, encoded submit parameters of this workflow (cached)."""
        if self._plan is None:
            spec = self.limit
            params = (
                None
                if spec is None
                else _limits_store.spec_params(
                    spec.name, spec.max, spec.per, spec.on_limit, spec.counts
                )
            )
            step_params = {
                name: _spec_params(step.limit)
                for name, step in self.steps.items()
                if step.limit is not None
            }
            step_rates = {
                name: _spec_params(step.limit.rate)
                for name, step in self.steps.items()
                if step.limit is not None and step.limit.rate is not None
            }
            self._plan = submission.Plan.build(
                self.name, self.graph(), params, step_params, step_rates
            )
        return self._plan

    def _limited_steps(self) -> dict[str, limits.Spec]:
        """The limit of each limited step, by step name."""
        return {name: st.limit for name, st in self.steps.items() if st.limit is not None}

    def _limit_key(self, value: In) -> submission.LimitKeys | None:
        """The keys of ``value`` under this workflow's limit and its steps' (raises before
        anything is sent); None when nothing is limited."""
        steps = self._limited_steps()
        if self.limit is None and not steps:
            return None
        return submission.LimitKeys(
            None if self.limit is None else self.limit.key_of(value),
            {name: spec.key_of(value) for name, spec in steps.items()},
            {
                name: spec.rate.key_of(value)
                for name, spec in steps.items()
                if spec.rate is not None
            },
        )

    def _encode_input(self, value: In) -> str:
        from cyclone import _codec

        return _codec.encode(value, what=f"input of workflow {self.name!r}", type_=self.input_type)

    def _handle(self, row: submission.Submitted) -> Run:
        return Run(
            row.engine,
            row.run_id,
            self.name,
            row.key,
            started=row.started,
            signal_types=self._signal_types(),
            definition=self,
        )

    def _handle_of(self, engine: Engine, run_id: uuid.UUID, key: str | None) -> Run:
        """The handle of run ``run_id`` of this workflow, read nothing (used by ``Run.fork``)."""
        return self._handle(submission.Submitted(engine, run_id, key, False))

    def submit(
        self,
        bind: Bind,
        input: In,
        *,
        deadline: datetime | timedelta | None = None,
        retention: timedelta | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> Run:
        """Make a new run in a transaction of its own. Each call makes a new run."""
        encoded = self._encode_input(input)
        row = submission.submit(
            bind,
            self.plan(),
            encoded,
            submission.Timing(deadline, retention, run_at, delay),
            self._limit_key(input),
        )
        return self._handle(row)

    def submit_tx(
        self,
        conn: Conn,
        input: In,
        *,
        deadline: datetime | timedelta | None = None,
        retention: timedelta | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> Run:
        """Make a new run inside the caller's transaction; it exists once they commit."""
        encoded = self._encode_input(input)
        row = submission.submit_tx(
            conn,
            self.plan(),
            encoded,
            submission.Timing(deadline, retention, run_at, delay),
            self._limit_key(input),
        )
        return self._handle(row)

    def submit_once(
        self,
        bind: Bind,
        key: str,
        input: In,
        *,
        deadline: datetime | timedelta | None = None,
        retention: timedelta | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> tuple[Run, bool]:
        """Make the one run of ``key``, or return it: ``(run, created)``.

        Raises:
            InvalidKeyError: the key breaks the key rules (nothing is sent).
            InputError: the input cannot be encoded or does not match the input type.
            SubmitConflictError: the key's run has a different input (nothing is inserted).
        """
        encoded = self._encode_input(input)
        lk = self._limit_key(input)
        row = submission.submit_once(
            bind,
            self.plan(),
            key,
            encoded,
            submission.Timing(deadline, retention, run_at, delay),
            lk,
        )
        return self._handle(row), row.created

    def submit_once_tx(
        self,
        conn: Conn,
        key: str,
        input: In,
        *,
        deadline: datetime | timedelta | None = None,
        retention: timedelta | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> tuple[Run, bool]:
        """As :meth:`submit_once`, inside the caller's transaction (never commits it).

        A concurrent transaction submitting the same key waits until this one ends; a
        conflict raises without aborting the caller's transaction.
        """
        encoded = self._encode_input(input)
        lk = self._limit_key(input)
        row = submission.submit_once_tx(
            conn,
            self.plan(),
            key,
            encoded,
            submission.Timing(deadline, retention, run_at, delay),
            lk,
        )
        return self._handle(row), row.created

    def submit_once_many(
        self,
        bind: Bind,
        items: Sequence[tuple[str, In]],
        *,
        deadline: datetime | timedelta | None = None,
        retention: timedelta | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> list[tuple[Run, bool]]:
        """Submit many keys at once: one ``(run, created)`` per item, in input order.

        The same rules as :meth:`submit_once` hold per item. If any item conflicts,
        SubmitConflictError (for the first such item) is raised and the whole batch is
        rolled back: nothing is inserted.
        """
        encoded = [(key, self._encode_input(value)) for key, value in items]
        keys = [self._limit_key(value) for _, value in items]
        lks = None if keys and keys[0] is None else [k for k in keys if k is not None]
        rows = submission.submit_once_many(
            bind,
            self.plan(),
            encoded,
            submission.Timing(deadline, retention, run_at, delay),
            lks,
        )
        return [(self._handle(row), row.created) for row in rows]

    # -- schedules (keys and time) ------------------------------------------------------

    def schedule(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        input: In | Callable[[datetime], In],
        timezone: str = "UTC",
        missed: Literal["latest", "catch_up"] = "latest",
        max_catch_up: int = schedules.DEFAULT_MAX_CATCH_UP,
    ) -> schedules.Schedule:
        """Submit this workflow on a schedule: at each tick of ``cron`` or of ``every``.

        Each tick is ``submit_once(bind, f"schedule:{name}:{tick}", input)``, the tick in
        UTC ISO 8601 (``2026-01-31T03:00:00Z``), so it makes one run however many workers
        fire it. ``input`` is the run's input, or a callable given the tick (an aware
        datetime in ``timezone``) that returns it. ``cron`` is a cron expression (five
        fields, or six with seconds first; needs the ``cron`` extra) read in ``timezone``;
        ``every`` a whole number of seconds, ticking at its multiples since the Unix
        epoch. Ticks missed while no worker ran: ``"latest"`` fires only the most recent,
        ``"catch_up"`` the most recent ``max_catch_up``. A Worker serving this workflow
        registers the schedule (by its name, unique over all workflows) and fires it.

        Raises:
            DefinitionError: a bad name, expression, interval, time zone or policy, or
                a second schedule of this name on this workflow.
        """
        if name in self.schedules:
            raise errors.DefinitionError(
                f"schedule {name!r} of workflow {self.name!r} is defined twice"
            )
        defined = schedules.Schedule(
            self,
            name,
            cron=cron,
            every=every,
            input=input,
            timezone=timezone,
            missed=missed,
            max_catch_up=max_catch_up,
        )
        self.schedules[name] = defined
        return defined

    # -- lookup (keys and time) ---------------------------------------------------------

    def get_run(self, bind: Bind, key: str) -> Run | None:
        """The handle of the run of ``key``, or None when the key has no run (or was purged).

        One statement. Raises InvalidKeyError for a key that breaks the key rules.
        """
        run_id = _lookup.run_id_by_key(bind, self.name, key)
        if run_id is None:
            return None
        return self._handle(submission.Submitted(_binds.engine_of(bind), run_id, key, False))

    def get_run_tx(self, conn: Conn, key: str) -> Run | None:
        """As :meth:`get_run`, read inside the caller's transaction (it sees its own runs)."""
        executor, engine = _binds.joined(conn)
        run_id = _lookup.run_id_by_key_tx(executor, self.name, key)
        if run_id is None:
            return None
        return self._handle(submission.Submitted(engine, run_id, key, False))

    def run(self, bind: Bind, run_id: uuid.UUID | str) -> Run:
        """The handle of run ``run_id`` of this workflow.

        Raises:
            NotFoundError: there is no such run, or it belongs to another workflow.
        """
        rid, key = _lookup.key_of_run(bind, self.name, run_id)
        return self._handle(submission.Submitted(_binds.engine_of(bind), rid, key, False))

    # -- signals (keys and time) --------------------------------------------------------

    def signal(self, bind: Bind, key: str, signal: str, payload: Any) -> bool:
        """Send ``signal`` with ``payload`` to the run of ``key``, in a transaction of its own.

        Returns True when this call stored it, False when the same payload was sent
        before (a no-op). A signal sent before the run reaches its wait node is kept.

        Raises:
            NotFoundError: no run has ``key``, or its run has no wait node for ``signal``.
            SubmitConflictError: the signal was sent already with another payload.
            InvalidStateError: the run has finished.
        """
        _keys.check_key(key)
        encoded = self._encode_payload(signal, payload)
        with _binds.transaction(bind) as conn:
            return _waits.send(
                _executor.Observed(conn),
                workflow=self.name,
                key=key,
                run_id=None,
                signal=signal,
                payload=encoded,
            )

    def signal_tx(self, conn: Conn, key: str, signal: str, payload: Any) -> bool:
        """As :meth:`signal`, inside the caller's transaction: a rollback sends nothing.

        A conflict raises without aborting the caller's transaction.
        """
        _keys.check_key(key)
        encoded = self._encode_payload(signal, payload)
        executor, _engine = _binds.joined(conn)
        return _waits.send(
            executor,
            workflow=self.name,
            key=key,
            run_id=None,
            signal=signal,
            payload=encoded,
        )

    def _encode_payload(self, signal: str, payload: Any) -> str:
        return _waits.encode_payload(self._signal_types(), signal, payload)

    def _signal_types(self) -> dict[str, Any]:
        """The payload type of each signal this workflow's wait nodes wait for (kept until
        a step is added: every handle a submit returns carries it)."""
        if self._signals is None:
            steps = self.steps.values()
            self._signals = {n.signal: n.payload_type for n in steps if n.signal is not None}
        return self._signals


class ResultWorkflow(Workflow[In], Generic[In, Out]):
    """A workflow whose result node's output is the run's typed result."""

    _has_result = True

    # As for Workflow: each of ``In`` and ``Out`` is inferred from a class given as
    # ``input=`` / ``output=``, else Any.
    @overload
    def __init__(
        self: ResultWorkflow[In, Out],
        name: str,
        *,
        input: type[In],
        output: type[Out],
        queue: str = ...,
        concurrency: limits.Concurrency | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self: ResultWorkflow[In, Any],
        name: str,
        *,
        input: type[In],
        output: Any = ...,
        queue: str = ...,
        concurrency: limits.Concurrency | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self: ResultWorkflow[Any, Out],
        name: str,
        *,
        input: Any = ...,
        output: type[Out],
        queue: str = ...,
        concurrency: limits.Concurrency | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self: ResultWorkflow[Any, Any],
        name: str,
        *,
        input: Any = ...,
        output: Any = ...,
        queue: str = ...,
        concurrency: limits.Concurrency | None = ...,
    ) -> None: ...

    def __init__(
        self,
        name: str,
        *,
        input: type[In] | Any = Any,
        output: type[Out] | Any = Any,
        queue: str = DEFAULT_QUEUE,
        concurrency: limits.Concurrency | None = None,
    ) -> None:
        super().__init__(name, input=input, queue=queue, concurrency=concurrency)
        self.output_type: Any = output

    def result(
        self,
        name: str | None = None,
        *,
        after: Iterable[Step[Any] | str] = (),
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        queue: str | None = None,
        priority: int = 0,
    ) -> Callable[[Callable[..., Out]], Step[Out]]:
        """Decorate the result node: its output, decoded to ``output``, is the run's result."""
        return self._decorator(name, after, max_attempts, queue, priority, is_result=True)

    def _handle(self, row: submission.Submitted) -> ResultRun[Out]:
        return ResultRun(
            row.engine,
            row.run_id,
            self.name,
            row.key,
            self.output_type,
            started=row.started,
            signal_types=self._signal_types(),
            definition=self,
        )

    if TYPE_CHECKING:

        def submit(
            self,
            bind: Bind,
            input: In,
            *,
            deadline: datetime | timedelta | None = None,
            retention: timedelta | None = None,
            run_at: datetime | None = None,
            delay: timedelta | None = None,
        ) -> ResultRun[Out]: ...

        def submit_tx(
            self,
            conn: Conn,
            input: In,
            *,
            deadline: datetime | timedelta | None = None,
            retention: timedelta | None = None,
            run_at: datetime | None = None,
            delay: timedelta | None = None,
        ) -> ResultRun[Out]: ...

        def submit_once(
            self,
            bind: Bind,
            key: str,
            input: In,
            *,
            deadline: datetime | timedelta | None = None,
            retention: timedelta | None = None,
            run_at: datetime | None = None,
            delay: timedelta | None = None,
        ) -> tuple[ResultRun[Out], bool]: ...

        def submit_once_tx(
            self,
            conn: Conn,
            key: str,
            input: In,
            *,
            deadline: datetime | timedelta | None = None,
            retention: timedelta | None = None,
            run_at: datetime | None = None,
            delay: timedelta | None = None,
        ) -> tuple[ResultRun[Out], bool]: ...

        def submit_once_many(  # type: ignore[override]
            self,
            bind: Bind,
            items: Sequence[tuple[str, In]],
            *,
            deadline: datetime | timedelta | None = None,
            retention: timedelta | None = None,
            run_at: datetime | None = None,
            delay: timedelta | None = None,
        ) -> list[tuple[ResultRun[Out], bool]]: ...

        def get_run(self, bind: Bind, key: str) -> ResultRun[Out] | None: ...

        def get_run_tx(self, conn: Conn, key: str) -> ResultRun[Out] | None: ...

        def run(self, bind: Bind, run_id: uuid.UUID | str) -> ResultRun[Out]: ...


def _check_step_limits(
    where: str, concurrency: limits.Concurrency | None, rate: limits.Rate | None
) -> None:
    """Check the limits of a step or step kind: its attempts queue at the limit."""
    if concurrency is not None and not isinstance(concurrency, limits.Concurrency):
        raise errors.DefinitionError(f"{where}: concurrency= takes a Concurrency")
    if rate is not None and not isinstance(rate, limits.Rate):
        raise errors.DefinitionError(f"{where}: rate= takes a Rate")
    if concurrency is not None and concurrency.on_limit != "queue":
        raise errors.DefinitionError(
            f"{where}: on_limit={concurrency.on_limit!r} is for workflows; a step's attempts queue"
        )
    if (
        concurrency is not None
        and rate is not None
        and concurrency.name is not None
        and concurrency.name == rate.name
    ):
        raise errors.DefinitionError(f"{where}: its Concurrency and Rate need different names")


def _spec_params(spec: limits.Spec) -> dict[str, Any]:
    return _limits_store.spec_params(spec.name, spec.max, spec.per, spec.on_limit, spec.counts)


class StandaloneStep(Generic[In, R]):
    """A step kind that runs as a standalone job, enqueued with :meth:`enqueue`."""

    def __init__(
        self,
        kind: str,
        fn: Callable[..., R],
        *,
        max_attempts: int,
        queue: str,
        priority: int,
        concurrency: limits.Concurrency | None = None,
        rate: limits.Rate | None = None,
    ) -> None:
        check_name("a step kind", kind)
        _check_options(f"step kind {kind!r}", max_attempts, queue, priority)
        _check_step_limits(f"step kind {kind!r}", concurrency, rate)
        self.limit: limits.Spec | None = limits.resolve_pair(concurrency, rate, f"kind:{kind}")
        self.kind = kind
        self.fn = fn
        self.max_attempts = max_attempts
        self.queue = queue
        self.priority = priority
        self.args_type: Any = _arg_type(fn)
        self.output_type: Any = _return_type(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, ctx: StepContext, args: In) -> R:
        return self.fn(ctx, args)

    def __repr__(self) -> str:
        return f"<StandaloneStep {self.kind!r}>"

    def _request(
        self,
        args: In,
        unique: str | None,
        run_at: datetime | None,
        delay: timedelta | None,
        queue: str | None,
        priority: int | None,
        max_attempts: int | None,
    ) -> jobs.EnqueueRequest:
        from cyclone import _codec, _keys

        if unique is not None:
            _keys.check_key(unique)
        submission.check_start(run_at, delay)
        _check_overrides(f"step kind {self.kind!r}", max_attempts, queue, priority)
        return jobs.EnqueueRequest(
            kind=self.kind,
            args=_codec.encode(args, what=f"args of step {self.kind!r}", type_=self.args_type),
            unique=unique,
            run_at=run_at,
            delay=delay,
            queue=self.queue if queue is None else queue,
            priority=self.priority if priority is None else priority,
            max_attempts=self.max_attempts if max_attempts is None else max_attempts,
            output_type=self.output_type,
            **self._limit_fields(args),
        )

    def _limit_fields(self, args: In) -> dict[str, Any]:
        spec = self.limit
        if spec is None:
            return {}
        fields: dict[str, Any] = {"limit": _spec_params(spec), "limit_key": spec.key_of(args)}
        if spec.rate is not None:
            fields["rate"] = _spec_params(spec.rate)
            fields["rate_key"] = spec.rate.key_of(args)
        return fields

    def enqueue(
        self,
        bind: Bind,
        args: In,
        *,
        unique: str | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> jobs.Job[R]:
        """Enqueue one job of this kind in a transaction of its own.

        Raises:
            DuplicateError: ``unique`` is held by an active job of this kind.
        """
        req = self._request(args, unique, run_at, delay, queue, priority, max_attempts)
        return jobs.enqueue(bind, req)

    def enqueue_tx(
        self,
        conn: Conn,
        args: In,
        *,
        unique: str | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> jobs.Job[R]:
        """Enqueue one job inside the caller's transaction (a duplicate does not abort it)."""
        req = self._request(args, unique, run_at, delay, queue, priority, max_attempts)
        return jobs.enqueue_tx(conn, req)


def step(
    kind: str,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    concurrency: limits.Concurrency | None = None,
    rate: limits.Rate | None = None,
) -> Callable[[Callable[..., R]], StandaloneStep[Any, R]]:
    """Decorate ``fn(ctx, args) -> output`` as the standalone step kind ``kind``.

    ``concurrency=`` (a :class:`~cyclone.Concurrency`) bounds its running attempts per
    key across every worker; ``rate=`` (a :class:`~cyclone.Rate`) its attempt starts per
    window (see docs/flow-control.md).
    """
    if callable(kind):
        raise errors.DefinitionError('use @cyclone.step("kind"), with the kind name')

    def decorate(fn: Callable[..., R]) -> StandaloneStep[Any, R]:
        return StandaloneStep(
            kind,
            fn,
            max_attempts=max_attempts,
            queue=queue,
            priority=priority,
            concurrency=concurrency,
            rate=rate,
        )

    return decorate

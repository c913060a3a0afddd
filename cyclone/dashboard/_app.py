"""The dashboard's WSGI application: routing, pages, actions, CSRF and authorisation.

Pages read through :class:`cyclone.Client`, each in one snapshot; actions go through
cyclone's public handles and client (``Run.retry``, ``Run.retry_all``, ``Run.cancel``,
``Job.cancel``, ``Client.retry_job``, ``Client.retry_runs``, ``Client.cancel_runs``,
``Client.pause_schedule``, ``Client.resume_schedule``, ``Client.pause_queue``,
``Client.resume_queue``), so the dashboard changes nothing the library's own rules would
not allow. A bulk action on the filtered runs first shows a page that says how many runs
it will change, whose form posts the same filters.
"""

from __future__ import annotations

import math
import re
import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
from sqlalchemy import Engine
from werkzeug.exceptions import BadRequest, Forbidden, HTTPException, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from cyclone import errors
from cyclone.client import ActiveJobs, Client, FinishedMinute, Position
from cyclone.dashboard import _csrf, _dag, _format
from cyclone.jobs import Job
from cyclone.runs import Run
from cyclone.states import TERMINAL_RUN_STATES, JobState, Parked, RunState

Authorize = Callable[[Mapping[str, Any]], bool]

PAGE_SIZE = 50
CHILDREN_SHOWN = 100
"""The child runs a run page lists; it counts the others (a map of children may have
thousands)."""
SCAN_LIMIT = 10_000
"""Runs a listing reads, at most, to fill a page with a key prefix (no index serves it)."""
COUNT_CAP = 1_000
"""Where the overview's count of a workflow's runs in one state stops ("1,000+")."""

_NOTICES = {
    "retry": "Retry requested: the failed and cancelled steps run again.",
    "retry-all": "Retry of every step requested.",
    "cancel": "Cancelled.",
    "pause": "Paused: its ticks are not fired until it is resumed.",
    "resume": "Resumed: it fires again from its next tick.",
    "job-retry": "Retry requested: the job runs again from its first attempt.",
    "queue-pause": "Paused: no worker claims its jobs until it is resumed.",
    "queue-resume": "Resumed: workers claim its jobs again.",
}

_BULK = {
    "retry": ("Retry", "retried", "failed or cancelled", "retry_runs"),
    "cancel": ("Cancel", "cancelled", "running", "cancel_runs"),
}
"""Each bulk action on runs: its button, its past tense, the runs it acts on, its method."""

MAX_REFRESH = 2_147_483
"""The longest ``refresh=`` (seconds): a browser runs a ``setInterval`` of more than
2**31 - 1 ms at once, so a longer refresh made every open page fetch itself again
without pause."""

_COUNT = re.compile(r"[0-9]{1,18}")
"""The ``changed=`` count a bulk action's redirect carries (a bigint at most)."""

_STATIC_TYPES = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'self'; "
        "connect-src 'self'; form-action 'self'; "
        "frame-ancestors 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

_URLS = Map(
    [
        Rule("/", endpoint="overview"),
        Rule("/runs", endpoint="runs"),
        Rule(
            "/runs/<any(retry, cancel):action>-all", endpoint="runs_bulk", methods=["GET", "POST"]
        ),
        Rule("/runs/<uuid:run_id>", endpoint="run"),
        Rule(
            "/runs/<uuid:run_id>/<any(retry, 'retry-all', cancel):action>",
            endpoint="run_action",
            methods=["POST"],
        ),
        Rule("/jobs", endpoint="jobs"),
        Rule("/jobs/<int:job_id>", endpoint="job"),
        Rule(
            "/jobs/<int:job_id>/<any(cancel, retry):action>",
            endpoint="job_action",
            methods=["POST"],
        ),
        Rule("/schedules", endpoint="schedules"),
        Rule(
            "/schedules/<any(pause, resume):action>",
            endpoint="schedule_action",
            methods=["POST"],
        ),
        Rule("/queues", endpoint="queues"),
        Rule("/queues/<any(pause, resume):action>", endpoint="queue_action", methods=["POST"]),
        Rule("/limits", endpoint="limits"),
        Rule("/workers", endpoint="workers"),
        Rule("/static/<name>", endpoint="static"),
    ],
    strict_slashes=False,
)


class Dashboard:
    """The WSGI application :func:`cyclone.dashboard.create_app` returns."""

    def __init__(
        self,
        engine: Engine,
        *,
        authorize: Authorize | None,
        title: str,
        secret: bytes | str | None,
        refresh: float = 5.0,
    ) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(f"create_app takes a SQLAlchemy Engine, not {type(engine).__name__}")
        # Each is checked here, not at a request: a non-callable authorize failed every
        # request with a 500, and bytes(5) made a secret of five zero bytes anyone knows.
        if authorize is not None and not callable(authorize):
            raise TypeError(f"authorize must be callable or None, not {type(authorize).__name__}")
        self.engine = engine
        self.client = Client(engine)
        self.authorize = authorize
        self.title = title
        if (
            not isinstance(refresh, int | float)
            or not math.isfinite(refresh)
            or not 0 <= refresh <= MAX_REFRESH
        ):
            raise ValueError(
                f"refresh must be seconds from 0 (off) to {MAX_REFRESH:,}, not {refresh!r}"
            )
        self.refresh = refresh
        if secret is None:
            self._secret = secrets.token_bytes(32)
        elif not isinstance(secret, str | bytes | bytearray):
            raise TypeError(f"secret must be a str or bytes, not {type(secret).__name__}")
        elif not secret:
            raise ValueError("secret must not be empty: the CSRF tokens would be forgeable")
        else:
            self._secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        self._templates = jinja2.Environment(
            loader=jinja2.PackageLoader("cyclone.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._templates.filters.update(
            when=_format.when,
            hhmm=_format.hhmm,
            duration=_format.duration,
            pretty=_format.pretty,
            short_id=_format.short_id,
        )
        self._templates.globals.update(
            between=_format.between,
            records=_format.records,
            run_states=list(RunState),
            parked_ways=list(Parked),
            job_states=list(JobState),
        )

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        response = self._dispatch(request)
        for header, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(header, value)
        return response(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        nonce = request.cookies.get(_csrf.COOKIE)
        fresh_nonce = None
        if not nonce:
            nonce = fresh_nonce = _csrf.new_nonce()
        try:
            endpoint, args = _URLS.bind_to_environ(request.environ).match()
            if request.method == "POST":
                self._check_post(request)
            handler = getattr(self, f"_page_{endpoint}")
            response: Response = handler(request, _csrf.token_for(nonce, self._secret), **args)
        except HTTPException as exc:
            response = self._error(request, exc)
        if fresh_nonce is not None:
            response.set_cookie(
                _csrf.COOKIE,
                fresh_nonce,
                path=(request.script_root or "") + "/",
                httponly=True,
                samesite="Strict",
                secure=request.scheme == "https",
            )
        return response

    def _allowed(self, request: Request) -> bool:
        return self.authorize is not None and bool(self.authorize(request.environ))

    def _check_post(self, request: Request) -> None:
        if not self._allowed(request):
            raise Forbidden("This dashboard is read-only for you: actions are not allowed.")
        token = request.form.get(_csrf.FIELD)
        if not _csrf.is_valid(request.cookies.get(_csrf.COOKIE), token, self._secret):
            raise Forbidden("The form's CSRF token is missing or wrong: reload the page and retry.")

    def _render(
        self, request: Request, template: str, csrf: str, status: int = 200, **context: Any
    ) -> Response:
        root = request.script_root or ""
        page = self._templates.get_template(template).render(
            title=self.title,
            root=root,
            csrf_field=_csrf.FIELD,
            csrf_token=csrf,
            can_act=self._allowed(request),
            refresh=self.refresh if status == 200 else 0,
            **context,
        )
        response = Response(page, status=status, mimetype="text/html")
        response.headers["Cache-Control"] = "no-store"  # Back shows the state now, not then
        return response

    def _error(self, request: Request, exc: HTTPException) -> Response:
        if exc.code in (301, 302, 303, 307, 308):
            return exc.get_response(request.environ)
        return self._render(
            request,
            "error.html",
            "",
            status=exc.code or 500,
            code=exc.code,
            name=exc.name,
            message=exc.description,
        )

    # Pages

    def _page_overview(self, request: Request, csrf: str) -> Response:
        with self.client.snapshot() as reader:
            by_workflow = reader.count_runs_per_workflow(up_to=COUNT_CAP)
            parked = reader.count_parked_runs_per_workflow()
            active = reader.count_active_jobs()
            minutes = reader.count_finished_per_minute()
        return self._render(
            request,
            "overview.html",
            csrf,
            by_workflow=[
                (name, counts, parked.get(name, dict.fromkeys(Parked, 0)))
                for name, counts in by_workflow.items()
            ],
            count_cap=COUNT_CAP,
            backlog=_backlog_by_queue(active),
            chart=_chart(minutes),
        )

    def _page_runs(self, request: Request, csrf: str) -> Response:
        args = request.args
        filters = {
            "workflow": _text(args.get("workflow"), "workflow"),
            "state": _choice(RunState, args.get("state")),
            "parked": _choice(Parked, args.get("parked"), "way of parking"),
            "key": _text(args.get("key"), "key"),
            "since": _moment(args.get("since"), "since"),
            "until": _moment(args.get("until"), "until"),
        }
        after = _cursor(args.get("after"), uuid.UUID)
        with self.client.snapshot() as reader:
            page = reader.page_runs(**filters, after=after, limit=PAGE_SIZE, scan=SCAN_LIMIT)
            names = reader.list_workflows()
        query = {k: v for k, v in args.items() if k != "after" and v}
        return self._render(
            request,
            "runs.html",
            csrf,
            bulk=_bulk_offered(filters),
            notice=_bulk_notice(request.args),
            rows=page.runs,
            names=names,
            raw={
                k: args.get(k, "") for k in ("workflow", "state", "parked", "key", "since", "until")
            },
            query=query,
            next_cursor=_encode(page.next),
            searched_to=page.searched_to,
            scan_limit=SCAN_LIMIT,
            paged=after is not None,
        )

    def _page_runs_bulk(self, request: Request, csrf: str, action: str) -> Response:
        """GET: how many runs the filters list that the action would change, and a form to
        confirm; POST (the form): the action on every one of them."""
        source = request.form if request.method == "POST" else request.args
        filters = {
            "workflow": _text(source.get("workflow"), "workflow"),
            "state": _choice(RunState, source.get("state")),
            "key": _text(source.get("key"), "key"),
            "since": _moment(source.get("since"), "since"),
            "until": _moment(source.get("until"), "until"),
            "parked": _choice(Parked, source.get("parked"), "way of parking"),
        }
        if filters["key"] is not None and filters["key"].endswith("*"):
            raise BadRequest("Bulk actions take an exact key, not a prefix.")
        label, _done, sources, method = _BULK[action]
        act = getattr(self.client, method)
        raw = {
            k: source.get(k, "") for k in ("workflow", "state", "key", "since", "until", "parked")
        }
        query = {k: v for k, v in raw.items() if v}
        if request.method == "POST":
            changed = act(**filters)
            back = {**query, "done": f"{action}-all", "changed": str(changed)}
            return redirect(f"{request.script_root}/runs?{urlencode(back)}", code=303)
        return self._render(
            request,
            "runs_bulk.html",
            csrf,
            action=action,
            label=label,
            sources=sources,
            count=act(**filters, dry_run=True),
            raw=raw,
            query=query,
        )

    def _page_run(self, request: Request, csrf: str, run_id: uuid.UUID) -> Response:
        notice = _NOTICES.get(request.args.get("done", ""))
        return self._run_page(request, csrf, run_id, notice=notice)

    def _run_page(
        self,
        request: Request,
        csrf: str,
        run_id: uuid.UUID,
        *,
        notice: str | None = None,
        problem: str | None = None,
    ) -> Response:
        context = self.run_context(run_id)
        if context is None:
            raise NotFound(f"There is no run {run_id} (never made, or purged).")
        return self._render(
            request,
            "run.html",
            csrf,
            status=200 if problem is None else 409,
            notice=notice,
            problem=problem,
            **context,
        )

    def run_context(self, run_id: uuid.UUID) -> dict[str, Any] | None:
        """What the run page's template shows of the run (one read); None if there is none."""
        detail = self.client.get_run_detail(run_id, children_limit=CHILDREN_SHOWN)
        if detail is None:
            return None
        steps = {s.name: s for s in detail.steps}
        after = {s["name"]: list(s.get("after", [])) for s in detail.graph.get("steps", [])}
        for name in steps:
            after.setdefault(name, [])
        layout = _dag.layout(after)
        ordered = [steps[n.name] for n in layout.nodes if n.name in steps]
        return {
            "run": detail.status,
            "detail": detail,
            "steps": steps,
            "ordered": ordered,
            "index": {step.name: i for i, step in enumerate(ordered, start=1)},
            "layout": layout,
            "node_width": _dag.NODE_WIDTH,
            "node_height": _dag.NODE_HEIGHT,
            "result": steps.get(detail.result_step) if detail.result_step else None,
            "terminal": detail.status.state in TERMINAL_RUN_STATES,
        }

    def render_run_sections(self, run_id: uuid.UUID) -> str | None:
        """The run page's error, steps (the DAG, then each step's attempts, errors with their
        tracebacks and output), input and result, as HTML to put in another application's
        page (the Django admin's run page), without actions; None if there is no such run.
        Its markup needs the dashboard's stylesheet, scoped: :func:`_embed.scoped_stylesheet`."""
        context = self.run_context(run_id)
        if context is None:
            return None
        template = self._templates.get_template("run.html")
        # A block rendered alone does not run the template's imports: give it the macros.
        macros = self._templates.get_template("macros.html").make_module()
        names = {k: v for k, v in vars(macros).items() if not k.startswith("_")}
        values = {
            "title": self.title,
            "root": "",
            "csrf_field": _csrf.FIELD,
            "csrf_token": "",
            "can_act": False,
            # The admin's change pages of the parent and children, beside this one's.
            "run_prefix": "../../",
            "run_suffix": "/change/",
            "notice": None,
            "problem": None,
            **names,
            **context,
        }
        return "".join(template.blocks["run_sections"](template.new_context(values)))

    def _page_run_action(
        self, request: Request, csrf: str, run_id: uuid.UUID, action: str
    ) -> Response:
        run = self.client.get_run(run_id)
        if run is None:
            raise NotFound(f"There is no run {run_id} (never made, or purged).")
        handle = Run(self.engine, run_id, run.workflow, run.key)
        operation = {"retry": handle.retry, "retry-all": handle.retry_all, "cancel": handle.cancel}
        try:
            operation[action]()
        except (errors.InvalidStateError, errors.NotFoundError) as exc:
            return self._run_page(request, csrf, run_id, problem=str(exc))
        return redirect(f"{request.script_root}/runs/{run_id}?done={action}", code=303)

    def _page_jobs(self, request: Request, csrf: str) -> Response:
        args = request.args
        queue = _text(args.get("queue"), "queue")
        kind = _text(args.get("kind"), "kind")
        state = _choice(JobState, args.get("state"))
        after = _cursor(args.get("after"), int)
        with self.client.snapshot() as reader:
            kinds = reader.count_active_jobs()
            rows = reader.list_jobs(
                queue=queue, kind=kind, state=state, after=after, limit=PAGE_SIZE + 1
            )
        query = {k: v for k, v in args.items() if k != "after" and v}
        return self._render(
            request,
            "jobs.html",
            csrf,
            kinds=kinds,
            rows=rows[:PAGE_SIZE],
            raw={k: args.get(k, "") for k in ("queue", "kind", "state")},
            query=query,
            next_cursor=_encode(rows[PAGE_SIZE - 1]) if len(rows) > PAGE_SIZE else None,
            paged=after is not None,
        )

    def _page_job(self, request: Request, csrf: str, job_id: int) -> Response:
        detail = self.client.get_job_detail(job_id)
        if detail is None:
            raise NotFound(f"There is no job {job_id} (never made, or purged).")
        return self._render(
            request,
            "job.html",
            csrf,
            job=detail.status,
            detail=detail,
            notice=_NOTICES.get(request.args.get("done", "")),
            problem=None,
        )

    def _page_schedules(self, request: Request, csrf: str) -> Response:
        return self._schedules_page(
            request, csrf, notice=_NOTICES.get(request.args.get("done", ""))
        )

    def _schedules_page(
        self,
        request: Request,
        csrf: str,
        *,
        notice: str | None = None,
        problem: str | None = None,
    ) -> Response:
        return self._render(
            request,
            "schedules.html",
            csrf,
            status=200 if problem is None else 404,
            schedules=self.client.list_schedules(),
            notice=notice,
            problem=problem,
        )

    def _page_limits(self, request: Request, csrf: str) -> Response:
        """Every limit and, per key with something running or waiting, how many."""
        return self._render(request, "limits.html", csrf, limits=self.client.list_limits())

    def _page_workers(self, request: Request, csrf: str) -> Response:
        """Every registered worker: what it serves, its last heartbeat, its running jobs."""
        return self._render(request, "workers.html", csrf, workers=self.client.list_workers())

    def _page_schedule_action(self, request: Request, csrf: str, action: str) -> Response:
        name = _text(request.form.get("schedule"), "schedule")
        if not name:
            raise BadRequest("The form names no schedule.")
        operation = {"pause": self.client.pause_schedule, "resume": self.client.resume_schedule}
        try:
            operation[action](name)
        except errors.NotFoundError as exc:
            return self._schedules_page(request, csrf, problem=str(exc))
        return redirect(f"{request.script_root}/schedules?done={action}", code=303)

    def _page_job_action(self, request: Request, csrf: str, job_id: int, action: str) -> Response:
        detail = self.client.get_job_detail(job_id)
        if detail is None:
            raise NotFound(f"There is no job {job_id} (never made, or purged).")
        try:
            if action == "retry":
                self.client.retry_job(job_id)
            else:
                Job(self.engine, job_id, detail.status.kind, detail.status.key).cancel()
        except (errors.InvalidStateError, errors.NotFoundError, errors.DuplicateError) as exc:
            return self._render(
                request,
                "job.html",
                csrf,
                status=409,
                job=detail.status,
                detail=detail,
                notice=None,
                problem=str(exc),
            )
        done = "job-retry" if action == "retry" else "cancel"
        return redirect(f"{request.script_root}/jobs/{job_id}?done={done}", code=303)

    def _page_queues(self, request: Request, csrf: str) -> Response:
        return self._render(
            request,
            "queues.html",
            csrf,
            queues=self.client.list_queues(),
            notice=_NOTICES.get(request.args.get("done", "")),
        )

    def _page_queue_action(self, request: Request, csrf: str, action: str) -> Response:
        name = _text(request.form.get("queue"), "queue")
        if not name:
            raise BadRequest("The form names no queue.")
        operation = {"pause": self.client.pause_queue, "resume": self.client.resume_queue}
        operation[action](name)
        return redirect(f"{request.script_root}/queues?done=queue-{action}", code=303)

    def _page_static(self, request: Request, csrf: str, name: str) -> Response:
        suffix = name.rpartition(".")[2]
        if suffix not in _STATIC_TYPES or "/" in name:
            raise NotFound()
        resource = resources.files("cyclone.dashboard") / "static" / name
        if not resource.is_file():
            raise NotFound()
        response = Response(resource.read_bytes(), mimetype=_STATIC_TYPES[suffix])
        response.headers["Cache-Control"] = "public, max-age=3600"
        return response


def _bulk_offered(filters: Mapping[str, Any]) -> list[str]:
    """The bulk actions the runs list offers for its filters: those its state allows (a
    key prefix is not a filter of ``Client.list_runs``: none then)."""
    key = filters.get("key")
    if key is not None and key.endswith("*"):
        return []
    state = filters.get("state")
    offered = []
    if state in (None, RunState.FAILED, RunState.CANCELLED):
        offered.append("retry")
    if state in (None, RunState.RUNNING):
        offered.append("cancel")
    return offered


def _bulk_notice(args: Mapping[str, str]) -> str | None:
    done = args.get("done", "")
    action = done.removesuffix("-all")
    if action not in _BULK or not done.endswith("-all"):
        return None
    changed = args.get("changed", "0")
    # ASCII digits, a few of them: str.isdigit() takes "²", which int() refuses, and int()
    # refuses more than 4,300 digits; either was a 500.
    count = int(changed) if _COUNT.fullmatch(changed) else 0
    return f"{_BULK[action][1].capitalize()} {count:,} run{'' if count == 1 else 's'}."


def _text(value: str | None, field: str) -> str | None:
    """A text filter or form field, None when empty. A NUL (``%00``) is a BadRequest: no
    stored name or key holds one, and the Client refuses it with a ValueError, which
    escaped as a 500 with its traceback."""
    if not value:
        return None
    if "\x00" in value:
        raise BadRequest(f"{field!r} holds a NUL character, which no stored {field} has.")
    return value


def _choice(enum: Any, value: str | None, what: str = "state") -> Any:
    if not value:
        return None
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise BadRequest(f"Unknown {what} {value!r}: use one of {choices}.") from None


def _moment(value: str | None, field: str) -> datetime | None:
    """A time filter: ISO 8601 or a browser's datetime-local; without an offset it is UTC."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise BadRequest(
            f"{field!r} is not a date and time: write it as 2026-01-31T13:45 (UTC) "
            "or with an offset."
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Cursor:
    """The position of a page's last row in a listing, as the next page's link carries it."""

    created_at: datetime
    id: Any


def _encode(row: Position | None) -> str | None:
    return None if row is None else f"{row.created_at.isoformat()}~{row.id}"


def _cursor(value: str | None, id_type: type[Any]) -> Cursor | None:
    """The position a page link's ``after`` names (a BadRequest for anything else)."""
    if not value:
        return None
    created, sep, ident = value.partition("~")
    try:
        if not sep:
            raise ValueError("no separator")
        when = datetime.fromisoformat(created)
        if when.tzinfo is None:
            raise ValueError("no offset")
        position = id_type(ident)
        # A job's id is a bigint: one past it failed in the driver (a 500).
        if id_type is int and not -(2**63) <= position < 2**63:
            raise ValueError("past bigint")
        return Cursor(when, position)
    except ValueError:
        raise BadRequest("The page cursor is not valid: start again from the first page.") from None


@dataclass(frozen=True, slots=True)
class Backlog:
    """Active jobs of one queue: due now, scheduled later, running."""

    queue: str
    ready: int
    scheduled: int
    running: int


def _backlog_by_queue(active: list[ActiveJobs]) -> list[Backlog]:
    """Active jobs summed per queue."""
    queues: dict[str, list[int]] = {}
    for a in active:
        total = queues.setdefault(a.queue, [0, 0, 0])
        total[0] += a.ready
        total[1] += a.scheduled
        total[2] += a.running
    return [Backlog(queue, *counts) for queue, counts in sorted(queues.items())]


def _chart(finished: list[FinishedMinute]) -> dict[str, Any]:
    """Bar geometry for the per-minute chart: completed stacked under failed."""
    minutes = [(f.minute, f.completed, f.failed) for f in finished]
    width, height, bar = 8, 100, 6
    peak = max((c + f for _, c, f in minutes), default=0) or 1
    bars = []
    for i, (minute, completed, failed) in enumerate(minutes):
        done_h = round(completed * height / peak)
        fail_h = round(failed * height / peak)
        bars.append(
            {
                "x": i * width,
                "minute": minute,
                "completed": completed,
                "failed": failed,
                "done_y": height - done_h,
                "done_h": done_h,
                "fail_y": height - done_h - fail_h,
                "fail_h": fail_h,
            }
        )
    return {
        "bars": bars,
        "width": len(minutes) * width,
        "height": height,
        "bar": bar,
        "peak": peak,
        "completed": sum(c for _, c, _ in minutes),
        "failed": sum(f for _, _, f in minutes),
    }

"""cyclone in a Django project, through Django's own test runner (``manage.py test``).

TestCase runs each test inside a transaction that is rolled back, so it checks what
Django's connection sees; TransactionTestCase commits for real, so it checks what other
connections (cyclone's Engine, a worker, another process) see. cyclone's tables are
unmanaged: Django's flush between TransactionTestCases leaves them alone, so every test
uses keys of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from typing import Any

from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import SimpleTestCase, TestCase, TransactionTestCase, override_settings
from django.utils.connection import ConnectionDoesNotExist
from project.settings import BASE_DIR

import cyclone
from cyclone.contrib.django import definitions, engine, worker
from cyclone.contrib.django.models import Job, Queue, Run
from shop.models import Order, Shipment
from shop.workflows import (
    OrderPlaced,
    Probe,
    Refund,
    fulfil,
    packing,
    payment,
    reconnect,
    refund,
    restock,
    send_receipt,
)


class DiscoveryTests(SimpleTestCase):
    """The worker's definitions: the apps' ``workflows`` modules, or the modules listed."""

    def test_the_workflows_modules_of_installed_apps_are_found(self) -> None:
        workflows, steps = definitions()
        self.assertEqual(
            {wf.name for wf in workflows},
            {"shop.fulfil", "shop.restock", "shop.reconnect", "shop.payment", "shop.packing"},
        )
        self.assertEqual({step.kind for step in steps}, {"shop.receipt", "shop.refund"})

    @override_settings(CYCLONE_WORKFLOW_MODULES=["shop.workflows"])
    def test_listed_modules_replace_discovery(self) -> None:
        workflows, _ = definitions()
        self.assertIn(fulfil, workflows)

    @override_settings(CYCLONE_WORKFLOW_MODULES=["shop.models"])
    def test_a_listed_module_defining_nothing_is_named(self) -> None:
        with self.assertRaisesMessage(ImproperlyConfigured, "'shop.models' defines no"):
            definitions()

    @override_settings(CYCLONE_WORKFLOW_MODULES=["shop.nowhere"])
    def test_a_listed_module_that_does_not_import_is_named(self) -> None:
        with self.assertRaisesMessage(ImproperlyConfigured, "cannot import 'shop.nowhere'"):
            definitions()


class Rollback(Exception):
    """Raised inside an atomic block to roll it back."""


def new_key() -> str:
    return f"order:{uuid.uuid4().hex}"


def place(key: str, item: str = "tea", quantity: int = 2, using: str = "default") -> Any:
    """Save an order and submit its run on Django's connection of ``using``."""
    order = Order.objects.using(using).create(request_id=key, item=item, quantity=quantity)
    placed = OrderPlaced(order_id=order.id, item=item, quantity=quantity)
    run, created = fulfil.submit_once_tx(connections[using], key, placed)
    assert created
    return run


def committed_runs(key: str, alias: str = "default") -> list[cyclone.RunStatus]:
    """The runs of ``key`` another connection sees (cyclone's own Engine for the alias)."""
    return cyclone.Client(engine(alias)).list_runs(workflow=fulfil.name, key=key)


class SubmitInTransactionTests(TestCase):
    """The run is part of Django's transaction: savepoints and rollbacks included."""

    databases = {"default", "archive"}

    def test_run_and_order_roll_back_together(self) -> None:
        key = new_key()
        with self.assertRaises(Rollback), transaction.atomic():
            run = place(key)
            self.assertTrue(Run.objects.filter(id=run.id).exists())
            raise Rollback
        self.assertFalse(Run.objects.filter(submit_key=key).exists())
        self.assertFalse(Order.objects.filter(request_id=key).exists())

    def test_savepoint_rollback_removes_only_its_own_run(self) -> None:
        outer_key, inner_key = new_key(), new_key()
        with transaction.atomic():
            outer = place(outer_key)
            with self.assertRaises(Rollback), transaction.atomic():
                place(inner_key)
                raise Rollback
            self.assertFalse(Run.objects.filter(submit_key=inner_key).exists())
            self.assertTrue(Run.objects.filter(id=outer.id).exists())
        self.assertEqual(
            list(Run.objects.filter(submit_key__in=[outer_key, inner_key])),
            [Run.objects.get(id=outer.id)],
        )

    def test_same_key_twice_in_one_transaction_returns_the_first_run(self) -> None:
        key = new_key()
        with transaction.atomic():
            first = place(key)
            order = Order.objects.get(request_id=key)
            again, created = fulfil.submit_once_tx(
                connection, key, OrderPlaced(order_id=order.id, item="tea", quantity=2)
            )
        self.assertFalse(created)
        self.assertEqual(again.id, first.id)

    def test_conflicting_input_raises_and_leaves_the_transaction_usable(self) -> None:
        key = new_key()
        with transaction.atomic():
            place(key)
            with self.assertRaises(cyclone.SubmitConflictError):
                fulfil.submit_once_tx(
                    connection, key, OrderPlaced(order_id=0, item="x", quantity=1)
                )
            Order.objects.create(request_id=f"{key}:after", item="tea", quantity=1)
        self.assertEqual(Order.objects.filter(request_id__startswith=key).count(), 2)

    def test_connections_alias_joins_that_databases_transaction(self) -> None:
        key = new_key()
        with self.assertRaises(Rollback), transaction.atomic(using="archive"):
            run = place(key, using="archive")
            self.assertTrue(Run.objects.using("archive").filter(id=run.id).exists())
            self.assertFalse(Run.objects.using("default").filter(id=run.id).exists())
            raise Rollback
        self.assertFalse(Run.objects.using("archive").filter(submit_key=key).exists())

    def test_submit_in_a_broken_transaction_is_refused(self) -> None:
        key = new_key()
        Order.objects.create(request_id=key, item="tea", quantity=1)
        with transaction.atomic():
            with self.assertRaises(IntegrityError):
                Order.objects.create(request_id=key, item="tea", quantity=1)
            with self.assertRaises(TransactionManagementError):
                fulfil.submit_once_tx(
                    connection, key, OrderPlaced(order_id=1, item="tea", quantity=1)
                )
            transaction.set_rollback(True)
        self.assertFalse(Run.objects.filter(submit_key=key).exists())

    def test_an_alias_that_does_not_exist_is_a_clear_error(self) -> None:
        with self.assertRaisesMessage(ConnectionDoesNotExist, "nope"):
            fulfil.submit_once_tx(
                connections["nope"], new_key(), OrderPlaced(order_id=1, item="tea", quantity=1)
            )
        with self.assertRaisesMessage(ImproperlyConfigured, "no alias 'nope'"):
            engine("nope")
        with (
            override_settings(CYCLONE_DATABASE="nope"),
            self.assertRaisesMessage(ImproperlyConfigured, "no alias 'nope'"),
        ):
            worker()

    def test_a_retried_post_returns_the_same_run(self) -> None:
        form = {"request_id": uuid.uuid4().hex, "item": "tea", "quantity": "2"}
        first = self.client.post("/orders", form)
        again = self.client.post("/orders", form)
        self.assertEqual((first.status_code, again.status_code), (201, 200))
        self.assertEqual(again.json()["run"], first.json()["run"])
        self.assertEqual((first.json()["created"], again.json()["created"]), (True, False))
        self.assertEqual(Order.objects.filter(request_id=form["request_id"]).count(), 1)
        status = self.client.get(f"/orders/{first.json()['order']}")
        self.assertEqual(status.json()["state"], "running")


class EmptiesCycloneTables(TransactionTestCase):
    """Empties cyclone's tables after each test: Django's flush leaves unmanaged tables alone."""

    def tearDown(self) -> None:
        for alias in self.databases:
            if connections[alias].settings_dict["TEST"].get("MIRROR"):
                continue
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    "TRUNCATE cyclone_signals, cyclone_jobs, cyclone_runs, cyclone_schedules, "
                    "cyclone_queues"
                )
        super().tearDown()


class CommitTests(EmptiesCycloneTables):
    """What other connections see: the run commits with the block, or not at all."""

    databases = {"default", "archive"}

    def test_run_commits_with_the_atomic_block(self) -> None:
        key = new_key()
        with transaction.atomic():
            run = place(key)
            self.assertEqual(committed_runs(key), [])
        self.assertEqual([status.id for status in committed_runs(key)], [run.id])
        self.assertEqual(run.status().state, cyclone.RunState.RUNNING)

    def test_rollback_frees_the_key(self) -> None:
        key = new_key()
        with self.assertRaises(Rollback), transaction.atomic():
            place(key)
            raise Rollback
        self.assertEqual(committed_runs(key), [])
        with transaction.atomic():
            place(key)
        self.assertEqual(len(committed_runs(key)), 1)

    def test_savepoint_rollback_commits_the_outer_run_only(self) -> None:
        outer_key, inner_key = new_key(), new_key()
        with transaction.atomic():
            outer = place(outer_key)
            with self.assertRaises(Rollback), transaction.atomic():
                place(inner_key)
                raise Rollback
        self.assertEqual([status.id for status in committed_runs(outer_key)], [outer.id])
        self.assertEqual(committed_runs(inner_key), [])

    def test_outside_atomic_the_submit_commits_at_once_as_save_does(self) -> None:
        key = new_key()
        order = Order.objects.create(request_id=key, item="tea", quantity=1)
        run, created = fulfil.submit_once_tx(
            connection, key, OrderPlaced(order_id=order.id, item="tea", quantity=1)
        )
        self.assertTrue(created)
        self.assertEqual([status.id for status in committed_runs(key)], [run.id])

    def test_a_run_on_another_alias_commits_there_and_its_handle_reads_there(self) -> None:
        key = new_key()
        with transaction.atomic(using="archive"):
            run = place(key, using="archive")
        self.assertEqual(committed_runs(key), [])
        self.assertEqual([status.id for status in committed_runs(key, "archive")], [run.id])
        self.assertEqual(run.status().state, cyclone.RunState.RUNNING)


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    """Run this project's manage.py in a new process, on the test databases."""
    env = {
        **os.environ,
        "SHOP_DATABASE_NAME": connections["default"].settings_dict["NAME"],
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class WorkerTests(EmptiesCycloneTables):
    """``manage.py cyclone worker`` runs the runs; steps get fresh Django connections."""

    databases = {"default", "persistent"}

    def test_manage_py_cyclone_worker_drain_runs_the_run(self) -> None:
        key = new_key()
        run = place(key, item="tea", quantity=2)
        done = manage("cyclone", "worker", "--drain")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.strip(), "ran 2 jobs: 2 completed, 0 retried, 0 failed")
        self.assertEqual(run.wait(timeout=30).state, cyclone.RunState.COMPLETED)
        shipment = Shipment.objects.get(order__request_id=key)
        self.assertEqual(shipment.label, "2 x tea")

    def test_call_command_cyclone_worker_drain_runs_the_run(self) -> None:
        run = place(new_key())
        call_command("cyclone", "worker", "--drain")
        self.assertEqual(run.status().state, cyclone.RunState.COMPLETED)

    def test_manage_py_cyclone_runs_list_shows_the_run(self) -> None:
        key = new_key()
        run = place(key)
        listed = manage("cyclone", "runs", "list", "--key", key, "--json")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(json.loads(listed.stdout)["id"], str(run.id))

    def test_manage_py_cyclone_bad_usage_is_one_line_and_exit_2(self) -> None:
        done = manage("cyclone", "no-such-command")
        self.assertEqual(done.returncode, 2)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
        self.assertIn("no-such-command", done.stderr)

    def drain_probe(self, probe: Probe) -> tuple[int, int]:
        run, _ = reconnect.submit_once(engine(), uuid.uuid4().hex, probe)
        with worker(concurrency=1) as w:
            w.drain()
        self.assertEqual(run.status().state, cyclone.RunState.COMPLETED)
        first, second = (Job.objects.get(run_id=run.id, kind=kind) for kind in ("first", "second"))
        self.assertEqual((second.attempt, second.errors), (1, []))
        return first.output, second.output

    def test_each_step_closes_its_connections_at_conn_max_age_0(self) -> None:
        first, second = self.drain_probe(Probe(alias="default"))
        self.assertNotEqual(first, second)

    def test_a_persistent_connection_is_kept_between_steps(self) -> None:
        first, second = self.drain_probe(Probe(alias="persistent"))
        self.assertEqual(first, second)

    def test_a_terminated_connection_is_replaced_before_the_next_step(self) -> None:
        first, second = self.drain_probe(Probe(alias="persistent", terminate=True))
        self.assertNotEqual(first, second)

    def test_the_connection_a_step_thread_kept_is_closed_when_the_worker_stops(self) -> None:
        # Left to the garbage collector, it outlived the worker, and now and then the test
        # runner could not drop its test database ("being accessed by other users").
        _, kept = self.drain_probe(Probe(alias="persistent"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [kept])
                if cursor.fetchone()[0] == 0:
                    break
            time.sleep(0.01)  # the server process ends after its client closed
        else:
            self.fail(f"the step thread's connection (server process {kept}) is still open")


class AdminTests(EmptiesCycloneTables):
    """Read-only admin pages for runs and jobs; actions retry and cancel runs."""

    def setUp(self) -> None:
        self.admin = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(self.admin)
        self.done_key, self.failed_key, self.running_key = (new_key() for _ in range(3))
        self.done = place(self.done_key)
        self.failed, _ = restock.submit_once(engine(), self.failed_key, "tea")
        with worker(concurrency=1) as w:
            w.drain()
        self.running = place(self.running_key)
        # A worker serving no queue its steps use starts the run (creates its steps), runs none.
        with worker(queues={"unserved": 8}) as w:
            w.drain()

    def test_a_run_no_worker_started_shows_when_it_starts_and_no_steps_yet(self) -> None:
        waiting = place(new_key())
        page = self.client.get(f"/admin/cyclone/run/{waiting.id}/change/")
        self.assertEqual(page.status_code, 200)
        self.assertContains(page, "Starts at")
        self.assertContains(page, "Set until a worker starts the run and creates its steps.")
        self.assertFalse(Job.objects.filter(run_id=waiting.id).exists())
        started = Run.objects.get(id=self.running.id)
        self.assertIsNone(started.start_at)

    def test_a_run_waiting_for_a_signal_is_shown_and_filtered_as_parked(self) -> None:
        waiting = payment.submit(engine(), 450)
        with worker() as w:
            w.drain()
        listed = self.client.get("/admin/cyclone/run/")
        self.assertContains(listed, '<td class="field-parked">waiting</td>', html=False)
        parked = self.client.get("/admin/cyclone/run/", {"parked": "waiting"})
        self.assertContains(parked, str(waiting.id))
        self.assertNotContains(parked, self.running_key)
        self.assertNotContains(
            self.client.get("/admin/cyclone/run/", {"parked": "delayed"}), str(waiting.id)
        )
        page = self.client.get(f"/admin/cyclone/run/{waiting.id}/change/")
        self.assertContains(page, "waiting for &#x27;paid&#x27;", count=2)  # the run, its step

    def test_run_list_shows_runs_and_filters_by_state_and_workflow(self) -> None:
        page = self.client.get("/admin/cyclone/run/")
        self.assertEqual(page.status_code, 200)
        for key in (self.done_key, self.failed_key, self.running_key):
            self.assertContains(page, key)
        failed = self.client.get("/admin/cyclone/run/", {"state__exact": "failed"})
        self.assertContains(failed, self.failed_key)
        self.assertNotContains(failed, self.done_key)
        fulfilment = self.client.get("/admin/cyclone/run/", {"workflow": "shop.fulfil"})
        self.assertContains(fulfilment, self.done_key)
        self.assertNotContains(fulfilment, self.failed_key)

    def test_run_page_shows_its_steps_with_attempts_and_errors(self) -> None:
        page = self.client.get(f"/admin/cyclone/run/{self.failed.id}/change/")
        self.assertEqual(page.status_code, 200)
        self.assertContains(page, "order_from_supplier")
        self.assertContains(page, "supplier has no tea")
        step = Job.objects.get(run_id=self.failed.id)
        self.assertEqual((step.state, step.attempt), ("failed", 1))

    def test_run_page_lists_a_map_node_once_not_each_of_its_items(self) -> None:
        run = packing.submit(engine(), ["tea", "cups", "saucers"])
        with worker(concurrency=1) as w:
            w.drain()
        self.assertEqual(run.status().state, cyclone.RunState.COMPLETED)
        self.assertEqual(Job.objects.filter(run_id=run.id).count(), 5)  # 2 steps, 3 items
        page = self.client.get(f"/admin/cyclone/run/{run.id}/change/")
        self.assertEqual(page.status_code, 200)
        (steps,) = page.context["inline_admin_formsets"]
        kinds = [form.instance.kind for form in steps.formset.forms]
        self.assertEqual(kinds, ["contents", "pack"])

    def test_run_page_draws_graph_errors_and_tracebacks_as_the_dashboard_and_links_to_it(
        self,
    ) -> None:
        hostile = restock.submit(engine(), "<b>tea</b>")
        with worker(concurrency=1) as w:
            w.drain()
        page = self.client.get(f"/admin/cyclone/run/{hostile.id}/change/")
        self.assertEqual(page.status_code, 200)
        html = page.content.decode()
        # The dashboard's drawing: the DAG, the error with its traceback, the input.
        self.assertIn('<svg class="dag"', html)
        self.assertIn('class="node node-failed"', html)
        self.assertIn("Error in step order_from_supplier", html)
        self.assertIn('<pre class="traceback">Traceback (most recent call last)', html)
        self.assertIn("supplier has no &lt;b&gt;tea&lt;/b&gt;", html)
        self.assertNotIn("<b>tea</b>", html)
        self.assertIn('<div class="cyclone-embed">', html)
        self.assertIn(".cyclone-embed svg.dag .node-failed rect", html)
        # ... the same markup as the dashboard's own run page, which the page links to.
        link = f'href="/ops/cyclone/runs/{hostile.id}"'
        self.assertIn(link, html)
        dashboard = self.client.get(f"/ops/cyclone/runs/{hostile.id}").content.decode()
        drawn = re.search(r'<svg class="dag".*?</svg>', html, re.S)
        assert drawn is not None
        self.assertIn(drawn.group(0), dashboard)
        # ... and not the JSON columns as admin fields, nor each attempt's errors as JSON.
        for column in ("graph", "error", "input", "result_step", "errors"):
            self.assertNotIn(f"field-{column}", html)
        self.assertNotIn('"traceback":', html)
        self.assertNotIn("[{&quot;", html)

    def test_run_page_of_a_running_run_draws_its_steps_without_actions(self) -> None:
        page = self.client.get(f"/admin/cyclone/run/{self.running.id}/change/")
        self.assertContains(page, 'class="node node-available"')
        self.assertContains(page, "This workflow has no result node")
        self.assertNotContains(page, f"/ops/cyclone/runs/{self.running.id}/cancel")
        self.assertNotContains(page, 'name="csrf_token"')

    def test_job_pages_list_and_show_jobs(self) -> None:
        failed = self.client.get("/admin/cyclone/job/", {"state__exact": "failed"})
        self.assertContains(failed, "order_from_supplier")
        self.assertContains(failed, '<td class="field-kind">order_from_supplier</td>', count=1)
        self.assertNotContains(failed, '<td class="field-kind">reserve</td>')
        restocking = self.client.get("/admin/cyclone/job/", {"workflow": "shop.restock"})
        self.assertContains(restocking, '<td class="field-kind">order_from_supplier</td>')
        self.assertNotContains(restocking, '<td class="field-kind">ship</td>')
        found = self.client.get("/admin/cyclone/job/", {"q": "ship"})
        self.assertContains(found, '<td class="field-kind">ship</td>', count=2)
        self.assertNotContains(found, '<td class="field-kind">reserve</td>')
        step = Job.objects.get(run_id=self.failed.id)
        page = self.client.get(f"/admin/cyclone/job/{step.id}/change/")
        self.assertContains(page, "supplier has no tea")

    def test_job_page_shows_args_output_and_errors_readably_not_as_raw_json(self) -> None:
        failed = refund.enqueue(engine(), Refund(order_id=9, cents=1250, reason="closed"))
        done = send_receipt.enqueue(engine(), 9)
        with worker(backoff=lambda attempt: 0.0) as w:
            w.drain()
        self.assertEqual(failed.status().state, cyclone.JobState.FAILED)
        page = self.client.get(f"/admin/cyclone/job/{failed.id}/change/")
        self.assertEqual(page.status_code, 200)
        html = page.content.decode()
        # The arguments: indented JSON in a <pre>, escaped (in jsonb's order of keys).
        shown = re.search(
            r'<div class="readonly"><pre class="cyclone-json">(.*?)</pre>', html, re.S
        )
        assert shown is not None
        self.assertEqual(
            sorted(shown.group(1).splitlines()),
            [
                "  &quot;cents&quot;: 1250,",
                "  &quot;order_id&quot;: 9",
                "  &quot;reason&quot;: &quot;closed&quot;,",
                "{",
                "}",
            ],
        )
        # Each attempt's error: its type and message, then its traceback in a <pre>.
        for attempt in (1, 2):
            self.assertIn(
                f"<p>attempt {attempt} · <strong>RuntimeError</strong>: the provider refused "
                "refund 9: &lt;b&gt;closed&lt;/b&gt; <span",
                html,
            )
        self.assertEqual(html.count('<pre class="cyclone-traceback">Traceback (most recent'), 2)
        self.assertIn("raise RuntimeError(", html)
        self.assertNotIn("<b>closed</b>", html)
        # ... not the raw JSON the columns hold.
        self.assertNotIn("[{&quot;", html)
        self.assertNotIn("&quot;traceback&quot;:", html)
        self.assertNotIn("{&quot;order_id&quot;: 9", html)
        self.assertIn('<div class="readonly">-</div>', html)  # no output: it failed

        page = self.client.get(f"/admin/cyclone/job/{done.id}/change/")
        self.assertContains(
            page, '<pre class="cyclone-json">&quot;receipt for order 9&quot;</pre>', count=1
        )
        self.assertContains(page, '<pre class="cyclone-json">9</pre>', count=1)
        self.assertNotContains(page, 'class="cyclone-error"')

    def test_admin_pages_say_started_and_finished_as_the_api_does_not_the_column_names(
        self,
    ) -> None:
        step = Job.objects.get(run_id=self.failed.id)
        pages = {
            "run list": self.client.get("/admin/cyclone/run/"),
            "run page": self.client.get(f"/admin/cyclone/run/{self.failed.id}/change/"),
            "job list": self.client.get("/admin/cyclone/job/"),
            "job page": self.client.get(f"/admin/cyclone/job/{step.id}/change/"),
        }
        for where, page in pages.items():
            with self.subTest(where):
                self.assertContains(page, "Finished")
                for label in ("Attempted", "Finalized", ">finalized", ">attempted"):
                    self.assertNotContains(page, label)
        for where in ("run page", "job page"):
            self.assertContains(pages[where], "Started")
        # The finished columns still sort, by the column behind them.
        for where in ("run list", "job list"):
            self.assertContains(pages[where], 'class="sortable column-finished_at')

    def test_pages_are_read_only(self) -> None:
        page = self.client.get("/admin/cyclone/run/")
        self.assertNotContains(page, "/admin/cyclone/run/add/")
        self.assertEqual(self.client.get("/admin/cyclone/run/add/").status_code, 403)
        change = f"/admin/cyclone/run/{self.done.id}/change/"
        self.assertEqual(self.client.post(change, {"workflow": "x"}).status_code, 403)
        delete = f"/admin/cyclone/run/{self.done.id}/delete/"
        self.assertEqual(self.client.post(delete, {"post": "yes"}).status_code, 403)
        self.assertEqual(self.done.status().workflow, "shop.fulfil")

    def act(self, action: str, run: cyclone.Run) -> Any:
        return self.client.post(
            "/admin/cyclone/run/",
            {"action": action, "_selected_action": [str(run.id)]},
            follow=True,
        )

    def test_retry_action_restarts_a_failed_run(self) -> None:
        self.assertEqual(self.failed.status().state, cyclone.RunState.FAILED)
        page = self.act("retry_runs", self.failed)
        self.assertContains(page, "Retried 1 run.")
        self.assertEqual(self.failed.status().state, cyclone.RunState.RUNNING)

    def test_cancel_action_cancels_a_running_run_and_reports_a_finished_one(self) -> None:
        page = self.act("cancel_runs", self.running)
        self.assertContains(page, "Cancelled 1 run.")
        self.assertEqual(self.running.status().state, cyclone.RunState.CANCELLED)
        refused = self.act("cancel_runs", self.done)
        self.assertContains(refused, "cannot cancel")
        self.assertEqual(self.done.status().state, cyclone.RunState.COMPLETED)

    def test_cancel_action_cancels_a_standalone_job_and_refuses_a_step(self) -> None:
        job = send_receipt.enqueue(engine(), 7)
        page = self.client.post(
            "/admin/cyclone/job/",
            {"action": "cancel_jobs", "_selected_action": [str(job.id)]},
            follow=True,
        )
        self.assertContains(page, "Cancelled 1 job.")
        self.assertEqual(job.status().state, cyclone.JobState.CANCELLED)
        step = Job.objects.get(run_id=self.running.id, kind="reserve")
        refused = self.client.post(
            "/admin/cyclone/job/",
            {"action": "cancel_jobs", "_selected_action": [str(step.id)]},
            follow=True,
        )
        self.assertContains(refused, "cancel the run")
        step.refresh_from_db()
        self.assertEqual(step.state, "available")

    def test_retry_action_runs_a_failed_standalone_job_again_and_refuses_a_step(self) -> None:
        job = send_receipt.enqueue(engine(), 8)
        job.cancel()
        page = self.client.post(
            "/admin/cyclone/job/",
            {"action": "retry_jobs", "_selected_action": [str(job.id)]},
            follow=True,
        )
        self.assertContains(page, "Retried 1 job.")
        self.assertEqual(job.status().state, cyclone.JobState.AVAILABLE)
        step = Job.objects.get(run_id=self.failed.id)
        refused = self.client.post(
            "/admin/cyclone/job/",
            {"action": "retry_jobs", "_selected_action": [str(step.id), str(job.id)]},
            follow=True,
        )
        self.assertContains(refused, "retry the run")
        self.assertContains(refused, f"cannot retry job {job.id}: it is available")
        step.refresh_from_db()
        self.assertEqual(step.state, "failed")
        job.cancel()

    def test_retry_and_cancel_actions_act_on_every_selected_run(self) -> None:
        other, _ = restock.submit_once(engine(), new_key(), "tea")
        with worker(concurrency=1) as w:
            w.drain()
        page = self.client.post(
            "/admin/cyclone/run/",
            {"action": "retry_runs", "_selected_action": [str(self.failed.id), str(other.id)]},
            follow=True,
        )
        self.assertContains(page, "Retried 2 runs.")
        page = self.client.post(
            "/admin/cyclone/run/",
            {"action": "cancel_runs", "_selected_action": [str(self.failed.id), str(other.id)]},
            follow=True,
        )
        self.assertContains(page, "Cancelled 2 runs.")
        self.assertEqual(other.status().state, cyclone.RunState.CANCELLED)

    def test_queue_actions_pause_and_resume_the_selected_queues(self) -> None:
        client = cyclone.Client(engine())
        client.pause_queue("receipts")
        client.pause_queue("archive")
        client.resume_queue("archive")
        listed = self.client.get("/admin/cyclone/queue/")
        self.assertEqual(listed.status_code, 200)
        self.assertContains(listed, "receipts")
        self.assertContains(listed, "archive")
        page = self.client.post(
            "/admin/cyclone/queue/",
            {"action": "resume_queues", "_selected_action": ["receipts"]},
            follow=True,
        )
        self.assertContains(page, "Resumed 1 queue.")
        self.assertFalse(Queue.objects.get(name="receipts").paused)
        page = self.client.post(
            "/admin/cyclone/queue/",
            {"action": "pause_queues", "_selected_action": ["receipts", "archive"]},
            follow=True,
        )
        self.assertContains(page, "Paused 2 queues.")
        self.assertEqual(
            {q.name: q.paused for q in Queue.objects.all()}, {"receipts": True, "archive": True}
        )
        self.assertEqual(self.client.get("/admin/cyclone/queue/add/").status_code, 403)

    def test_staff_without_the_operate_permission_can_view_but_not_act(self) -> None:
        viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
        viewer.user_permissions.add(
            Permission.objects.get(codename="view_run", content_type__app_label="cyclone")
        )
        self.client.force_login(viewer)
        page = self.client.get("/admin/cyclone/run/")
        self.assertEqual(page.status_code, 200)
        self.assertNotContains(page, "retry_runs")
        self.act("retry_runs", self.failed)
        self.assertEqual(self.failed.status().state, cyclone.RunState.FAILED)

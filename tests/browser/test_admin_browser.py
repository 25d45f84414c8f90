"""The admin in a real browser: headless Chromium driven by Selenium (docs/admin.md).

Needs the Debian packages `chromium` and `chromium-driver` (scripts/test installs them) and
`selenium` (the test extra). Every page visited is saved as a PNG in
$GEN_DURABLE_SCREENSHOTS (default build/screenshots/); docs/img/admin/ holds copies.
"""

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles.testing import StaticLiveServerTestCase

import gen_durable as gd
from gen_durable.models import HistoryEntry, Instance, Signal
from gen_durable.testing import drain
from tests.durable_app.durable import Plain
from tests.durable_app.signal_machines import FanOut, Recorder

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = Path(os.environ.get("GEN_DURABLE_SCREENSHOTS", Path(__file__).resolve().parents[2] / "build" / "screenshots"))
QUEUE = "browser_q"

pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                reason="needs the Debian packages chromium and chromium-driver (scripts/test installs them "
                                       "when run as root with apt)")


class AdminInBrowser(StaticLiveServerTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--window-size=1400,1000"):
            options.add_argument(arg)
        cls.browser = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
        cls.browser.implicitly_wait(5)
        SHOTS.mkdir(parents=True, exist_ok=True)

    @classmethod
    def tearDownClass(cls):
        cls.browser.quit()
        super().tearDownClass()

    def shot(self, name, height=1000):
        self.browser.set_window_size(1400, height)
        self.browser.save_screenshot(str(SHOTS / f"{name}.png"))
        self.browser.set_window_size(1400, 1000)

    def visit(self, path):
        self.browser.get(self.live_server_url + path)

    def wait_for(self, css):
        return WebDriverWait(self.browser, 15).until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))

    def after(self, act, css):
        """Do what loads a new page (a click, a submit), then wait for `css` on THAT page:
        the old page must go first, or its own elements would answer the wait."""
        old = self.browser.find_element(By.TAG_NAME, "html")
        act()

        def gone(_):
            try:
                old.tag_name  # noqa: B018 (asks the browser whether the node is still there)
            except WebDriverException:  # stale, or chromedriver's "does not belong to the document"
                return True
            return False

        WebDriverWait(self.browser, 15).until(gone)
        return self.wait_for(css)

    def test_operator_journey(self):
        User.objects.create_superuser("operator", "op@example.com", "s3cret-pass")
        parked = gd.insert(Recorder, state={"names": ["go"]}, queue=QUEUE, correlation_key="order:42")
        parent = gd.insert(FanOut, state={"kids": [{"i": 1}, {"i": 2, "fail": True}, {"i": 3}]}, queue=QUEUE)
        victim = gd.insert(Plain, queue=QUEUE, schedule_in=3600, correlation_key="order:43")
        drain(queue=QUEUE, with_scheduled=False)
        gd.signal(parked, "unrelated", {"note": "waits in the inbox"})
        assert Instance.objects.get(id=parked).status == "awaiting_signal"
        b = self.browser

        # log in
        self.visit("/admin/")
        self.wait_for("#id_username").send_keys("operator")
        b.find_element(By.ID, "id_password").send_keys("s3cret-pass")
        self.shot("01-login")
        self.after(b.find_element(By.CSS_SELECTOR, "input[type=submit]").click, "#content")
        assert "Queue overview" in b.page_source
        self.shot("02-index")

        # filter by status
        self.visit("/admin/gen_durable/instance/")
        self.wait_for("#changelist")
        self.after(b.find_element(By.LINK_TEXT, "Awaiting Signal").click, "#result_list")
        ids = [a.text for a in b.find_elements(By.CSS_SELECTOR, "#result_list th.field-id a")]
        assert str(parked) in ids and str(victim) not in ids
        self.shot("03-changelist-filtered")

        # search a correlation key
        self.visit("/admin/gen_durable/instance/")
        box = self.wait_for("#searchbar")
        box.send_keys("order:42")
        self.after(box.submit, "#result_list")
        ids = [a.text for a in b.find_elements(By.CSS_SELECTOR, "#result_list th.field-id a")]
        assert ids == [str(parked)]
        self.shot("04-search")

        # detail pages: inbox, children
        self.after(b.find_element(By.LINK_TEXT, str(parked)).click, "#gd-inbox")
        assert "waits in the inbox" in b.find_element(By.ID, "gd-inbox").text
        self.shot("05-detail-inbox", height=2300)
        self.visit(f"/admin/gen_durable/instance/{parent}/change/")
        children = self.wait_for("#gd-children").text
        assert children.count("tests.children.Kid") == 3 and "kid 2 failed" in children
        self.shot("06-detail-children", height=2300)

        # deliver a signal (per row, with a confirmation page)
        self.visit(f"/admin/gen_durable/instance/{parked}/change/")
        self.after(self.wait_for("#gd-act-signal").click, "#id_name").send_keys("go")
        payload = b.find_element(By.ID, "id_payload")
        payload.clear()
        payload.send_keys('{"amount": 12}')
        self.shot("07-signal-confirm")
        self.after(b.find_element(By.ID, "gd-confirm").click, "ul.messagelist")
        assert "Delivered signal 'go' to 1 instance" in b.find_element(By.CSS_SELECTOR, "ul.messagelist").text
        self.shot("08-signal-done")
        assert Instance.objects.get(id=parked).status == "runnable"
        assert Signal.objects.filter(target_id=parked, name="go", payload={"amount": 12}).exists()

        # cancel (bulk action from the list, with a confirmation page and a reason)
        self.visit("/admin/gen_durable/instance/?q=order:43")
        self.wait_for("#result_list")
        b.find_element(By.CSS_SELECTOR, f"input.action-select[value='{victim}']").click()
        Select(b.find_element(By.NAME, "action")).select_by_value("cancel_selected")
        reason = self.after(b.find_element(By.CSS_SELECTOR, "button[name=index], .actions button").click, "#id_reason")
        reason.clear()
        reason.send_keys("customer withdrew")
        self.shot("09-cancel-confirm")
        self.after(b.find_element(By.ID, "gd-confirm").click, "ul.messagelist")
        assert "Cancelled: 1 instance" in b.find_element(By.CSS_SELECTOR, "ul.messagelist").text
        row = Instance.objects.get(id=victim)
        assert (row.status, row.last_error) == ("failed", "customer withdrew")

        # the overview, then pause and resume a queue from it
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("ANALYZE gen_durable")  # the overview's estimates come from statistics
        self.visit("/admin/gen_durable/queueoverview/")
        self.wait_for("#gd-queues")
        assert b.find_element(By.ID, "gd-completions").tag_name == "svg"
        self.shot("10-overview")
        self.after(b.find_element(By.CSS_SELECTOR, f"#gd-queue-{QUEUE} input.gd-pause").click, "ul.messagelist")
        assert QUEUE in gd.paused_queues()
        self.shot("11-overview-paused")
        self.after(b.find_element(By.CSS_SELECTOR, f"#gd-queue-{QUEUE} input.gd-resume").click, "ul.messagelist")
        assert QUEUE not in gd.paused_queues()

    def test_failures_hung_steps_and_the_audit_trail(self):
        """What an operator sees of a failure (error column, traceback), of a hung step
        (seconds running, longest running) and of their own actions (History)."""
        import datetime as dt

        from django.contrib.admin.models import LogEntry

        from tests.durable_app.durable import SendsMail
        from tests.factories import ExecutingFactory

        User.objects.create_superuser("operator2", "op2@example.com", "s3cret-pass")
        failed = gd.insert(SendsMail, queue=QUEUE, state={"depth": 1}, correlation_key="mail:7")
        drain(queue=QUEUE)
        hung = ExecutingFactory(queue=QUEUE, fsm="shop.SyncInventory", step="call_warehouse",
                                locked_by="web-3:browser_q:tok")
        Instance.objects.filter(id=hung.id).update(updated_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1900))
        victim = gd.insert(Plain, queue=QUEUE, schedule_in=3600, correlation_key="order:77")
        b = self.browser
        self.client.force_login(User.objects.get(username="operator2"))
        cookie = self.client.cookies["sessionid"]
        self.visit("/admin/")
        b.add_cookie({"name": "sessionid", "value": cookie.value, "path": "/"})

        # the list: an error column, seconds running, no horizontal overflow at 1400 px
        self.visit(f"/admin/gen_durable/instance/?queue={QUEUE}&_facets=True")
        self.wait_for("#result_list")
        error = b.find_element(By.CSS_SELECTOR, "#result_list td.field-error span.gd-error")
        assert error.text.startswith("RuntimeError: smtp down")
        running = [td.text for td in b.find_elements(By.CSS_SELECTOR, "#result_list td.field-status_running")]
        assert any(t.startswith("Executing · 1,9") and t.endswith(" s") for t in running), running
        assert "Show counts" not in b.page_source
        self.shot("12-changelist-errors-running")
        # no horizontal scrolling, of the page or of the list, at 1400 px with the sidebar open
        assert b.execute_script("return document.documentElement.scrollWidth") <= 1400
        widths = b.execute_script("var r = document.querySelector('#changelist .results');"
                                  "return [r.scrollWidth, r.clientWidth]")
        assert widths[0] <= widths[1], f"the list overflows: {widths}"

        # a finished instance found by its key; its traceback on the detail page
        box = self.wait_for("#searchbar")
        box.clear()
        box.send_keys("mail:7")
        self.after(box.submit, "#result_list")
        tb = self.after(b.find_element(By.LINK_TEXT, str(failed)).click, "pre.gd-traceback").text
        assert 'durable.py", line' in tb and "in _nested" in tb and tb.endswith("RuntimeError: smtp down")
        self.shot("13-detail-traceback", height=1600)

        # the overview: longest running, failures in the chart
        self.visit("/admin/gen_durable/queueoverview/")
        longest = self.wait_for("#gd-longest").text
        assert f"#{hung.id}" in longest and "call_warehouse" in longest
        assert b.find_elements(By.CSS_SELECTOR, "#gd-completions rect.bar-failed")
        self.shot("14-overview-longest-running", height=1600)

        # cancel with a reason, then the instance's History shows who, when and why
        self.visit(f"/admin/gen_durable/instance/{victim}/change/")
        reason = self.after(self.wait_for("#gd-act-cancel").click, "#id_reason")
        reason.clear()
        reason.send_keys("customer withdrew by phone")
        self.after(b.find_element(By.ID, "gd-confirm").click, "ul.messagelist")
        assert LogEntry.objects.filter(object_id=str(victim), user__username="operator2").count() == 1
        self.visit(f"/admin/gen_durable/instance/{victim}/history/")
        history = self.wait_for("#change-history").text
        assert "Cancelled (admin action); reason: customer withdrew by phone" in history and "operator2" in history
        self.shot("15-history")

    def test_retry_all_matching_a_filter(self):
        """Django's "Select all N" on a filtered list: the "all matching" page shows the
        filter, a bounded count and the shell command, then retries every matching row
        in bounded batches and logs the run."""
        from django.contrib.admin.models import LogEntry

        from tests.factories import InstanceFactory

        queue = "q_browser_all"  # its own queue: the other tests' rows stay out of the count
        User.objects.create_superuser("operator3", "op3@example.com", "s3cret-pass")
        Instance.objects.bulk_create(InstanceFactory.build_batch(
            70, queue=queue, status="failed", fsm="shop.SendReceipt", step="send", last_error="SMTPError: 421 busy"))
        Instance.objects.bulk_create(InstanceFactory.build_batch(5, queue=queue, status="done"))
        b = self.browser
        self.client.force_login(User.objects.get(username="operator3"))
        cookie = self.client.cookies["sessionid"]
        self.visit("/admin/")
        b.add_cookie({"name": "sessionid", "value": cookie.value, "path": "/"})

        self.visit(f"/admin/gen_durable/instance/?status=failed&queue={queue}")
        self.wait_for("#action-toggle").click()  # a checkbox: no page load
        self.wait_for("#changelist-form .actions .question a").click()  # "Select all 70 instances"
        Select(b.find_element(By.NAME, "action")).select_by_value("retry_selected")
        assert self.after(b.find_element(By.CSS_SELECTOR, "#changelist-form .actions button[name=index]").click, "#gd-all-count").text == "70"
        assert f"status = failed, queue = {queue}" in b.find_element(By.ID, "gd-all-filter").text
        assert f"durable_bulk retry --status failed --queue {queue}" in b.find_element(By.ID, "gd-all-command").text
        b.find_element(By.ID, "id_reason").send_keys("SMTP relay back after the outage")
        self.shot("16-retry-all-matching-confirm")
        assert self.after(b.find_element(By.ID, "gd-confirm").click, "#gd-all-result").text.startswith("70 done, 0 skipped of 70 matched")
        assert b.find_elements(By.ID, "gd-all-finished")
        self.shot("17-retry-all-matching-done")
        assert Instance.objects.filter(queue=queue, status="runnable", fsm="shop.SendReceipt").count() == 70
        entry = LogEntry.objects.get(user__username="operator3")
        assert entry.change_message.startswith("Retried now (admin action, all matching); reason: SMTP relay back")
        # the result page was reached by a redirect: a reload shows it again and does nothing
        assert "run=" in b.current_url
        Instance.objects.filter(queue=queue, fsm="shop.SendReceipt").update(status="failed")
        b.refresh()
        assert self.wait_for("#gd-all-result").text.startswith("70 done, 0 skipped of 70 matched")
        assert Instance.objects.filter(queue=queue, status="failed", fsm="shop.SendReceipt").count() == 70
        assert LogEntry.objects.filter(user__username="operator3").count() == 1

    def test_the_timeline_of_a_machine(self):
        """A machine run by a worker — an inline step, a handled error retried, an Await,
        an admin's signal with a reason, the last step — reads as one timeline on its
        detail page, newest first (docs/admin.md "Timeline")."""
        from gen_durable.worker.supervisor import Supervisor, WorkerConfig
        from tests.conftest import wait_until
        from tests.durable_app.history_machines import HistoryFlow

        def wait(predicate, what):
            wait_until(predicate, timeout=15, interval=0.05, what=what)

        User.objects.create_superuser("operator4", "op4@example.com", "s3cret-pass")
        flow = gd.insert(HistoryFlow, queue=QUEUE, correlation_key="order:88")
        sup = Supervisor(WorkerConfig(queues={QUEUE: 2})).start()
        try:
            wait(lambda: Instance.objects.get(id=flow).status == "awaiting_signal", "the Await")
            b = self.browser
            self.client.force_login(User.objects.get(username="operator4"))
            self.visit("/admin/")
            b.add_cookie({"name": "sessionid", "value": self.client.cookies["sessionid"].value, "path": "/"})
            self.visit(f"/admin/gen_durable/instance/{flow}/change/")
            self.wait_for("#gd-act-signal").click()
            self.wait_for("#id_name").send_keys("go")
            b.find_element(By.ID, "id_reason").send_keys("warehouse confirmed by phone")
            self.after(b.find_element(By.ID, "gd-confirm").click, "ul.messagelist")
            wait(lambda: Instance.objects.get(id=flow).status == "done", "done")
            wait(lambda: HistoryEntry.objects.filter(instance_id=flow).count() == 4, "the last entry")
        finally:
            sup.stop()
        self.visit(f"/admin/gen_durable/instance/{flow}/change/")
        rows = [r.text for r in self.wait_for("#gd-timeline").find_elements(By.CSS_SELECTOR, "tbody tr")]
        assert len(rows) == 5, rows
        # The admin's log entry is saved after its signal call returns, so the step the
        # signal woke may end before it or after it: either order of the top two is true.
        top = sorted(rows[:2], key=lambda r: "admin operator4" in r)
        assert "step c attempt 0 → done" in top[0]
        assert "admin operator4" in top[1] and "warehouse confirmed by phone" in top[1]
        assert "step b attempt 1 → awaits signals" in rows[2]
        assert "step b attempt 0 → retry" in rows[3] and "ValueError: flaky" in rows[3]
        assert "step a attempt 0 → next step (inline)" in rows[4]
        b.execute_script("document.getElementById('gd-timeline').closest('fieldset').scrollIntoView()")
        self.browser.save_screenshot(str(SHOTS / "18-detail-timeline.png"))

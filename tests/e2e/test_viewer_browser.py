"""The viewer in a real browser: headless Chromium from Debian's packages, driven by Selenium
(-m browser; .ci/run installs chromium and chromium-driver). With ROLLFILTER_SCREENSHOTS=DIR the
pages are saved there as PNGs: docs/viewer.md's pictures are taken this way."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollfilter.viewer.server import Viewer
from rollfilter.viewer.static import static_page
from tests.viewer.conftest import catalog_of, result, results, serving, with_tool_call, write_lines

pytestmark = pytest.mark.browser
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FOREIGN = "rebound.example"  # a name the browser resolves to 127.0.0.1, as a DNS rebinding attack would


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} is missing: apt-get install chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,900")
    options.add_argument(f"--host-resolver-rules=MAP {FOREIGN} 127.0.0.1")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    path = tmp_path / "out.jsonl"
    write_lines(path, [*results(), *(result(task, rollout, rollout / 3) for task in (3, 4) for rollout in range(2))])
    return path


@pytest.fixture
def viewer(results_file: Path) -> Iterator[Viewer]:
    yield from serving(catalog_of(results_file))


def screenshot(driver: webdriver.Chrome, name: str) -> None:
    folder = os.environ.get("ROLLFILTER_SCREENSHOTS")
    if folder:
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def nothing_ran(driver: webdriver.Chrome) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 - raises when there is none
    except NoAlertPresentException:
        return driver.title != "pwned"
    return False


def rows(driver: webdriver.Chrome) -> list[str]:
    return [link.text for link in driver.find_elements(By.CSS_SELECTOR, "table.rollouts a")]


def test_the_figures_and_pictures(browser: webdriver.Chrome, viewer: Viewer):
    browser.get(viewer.url)
    cards = {
        card.text.splitlines()[-1]: card.text.splitlines()[0]
        for card in browser.find_elements(By.CSS_SELECTOR, ".card")
    }
    summary = viewer.catalog.summary
    assert cards["succeeded"] == str(summary["rollfilter"]["succeeded"])
    assert cards["mean@2"].startswith(f"{summary['mean@2']:.4g}")
    captions = [caption.text for caption in browser.find_elements(By.CSS_SELECTOR, "figcaption")]
    assert captions[:2] == ["reward", "tasks by rollouts that passed (pass_histogram)"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg rect.bar")) > 5
    screenshot(browser, "index")


def test_a_filter_from_the_form_is_kept_in_the_url(browser: webdriver.Chrome, viewer: Viewer):
    browser.get(viewer.url)
    browser.find_element(By.NAME, "task").send_keys("1")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    # The click starts the navigation; the new page is waited for (a bounded wait, not a sleep).
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda driver: "task=1" in driver.current_url and rows(driver) == ["1/0", "1/1"])
    browser.refresh()
    assert rows(browser) == ["1/0", "1/1"]


def test_a_transcript_with_a_tool_call(browser: webdriver.Chrome, viewer: Viewer):
    browser.get(viewer.url)
    browser.find_element(By.LINK_TEXT, "0/0").click()
    WebDriverWait(browser, 20).until(lambda driver: "/rollout/0/0" in driver.current_url)
    call = browser.find_element(By.CSS_SELECTOR, ".item.function_call")
    assert "get_weather" in call.text
    assert '"city": "Paris"' in call.text
    assert "sunny, 21 degrees" in browser.find_element(By.CSS_SELECTOR, ".item.function_call_output").text
    screenshot(browser, "transcript")
    browser.find_element(By.LINK_TEXT, "beside").click()
    WebDriverWait(browser, 20).until(lambda driver: "beside=" in driver.current_url)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".side .transcript")) == 2


def test_markup_in_model_output_is_text_and_runs_nothing(browser: webdriver.Chrome, viewer: Viewer):
    browser.get(viewer.url.rstrip("/") + "/rollout/0/1")
    shown = browser.find_element(By.CSS_SELECTOR, ".item.assistant").text
    assert '<script>document.title="pwned"</script><img src=x onerror=' in shown
    assert browser.find_elements(By.CSS_SELECTOR, ".transcript img, .transcript script") == []
    assert nothing_ran(browser)


def test_a_growing_file_shows_new_rollouts_on_reload(browser: webdriver.Chrome, viewer: Viewer, results_file: Path):
    browser.get(viewer.url)
    before = rows(browser)
    write_lines(results_file, [with_tool_call(result(7, 0, 1.0))], mode="a")
    browser.refresh()
    assert rows(browser) == [*before, "7/0"]


def test_a_page_for_another_host_is_refused(browser: webdriver.Chrome, viewer: Viewer):
    browser.get(f"http://{FOREIGN}:{viewer.port}/")
    assert "403" in browser.title
    assert rows(browser) == []


def test_the_page_written_as_one_file(browser: webdriver.Chrome, results_file: Path, tmp_path: Path):
    report = tmp_path / "report.html"
    report.write_text(static_page(catalog_of(results_file), max_rollouts=5), encoding="utf-8")
    browser.get(report.as_uri())
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg rect.bar")) > 5
    assert "A uniform sample of 5 of the 10 rollouts" in browser.find_element(By.TAG_NAME, "body").text
    background = browser.find_element(By.CSS_SELECTOR, ".bar").value_of_css_property("fill")
    assert background == "rgb(74, 122, 181)"  # the inline style applied: its hash is in the policy
    browser.find_element(By.CSS_SELECTOR, "table.rollouts a").click()
    assert nothing_ran(browser)
    screenshot(browser, "static")


def test_the_comparison_with_a_baseline(browser: webdriver.Chrome, results_file: Path, tmp_path: Path):
    baseline_file = tmp_path / "baseline.jsonl"
    write_lines(baseline_file, [result(task, rollout, 0.0) for task in (0, 1, 3) for rollout in range(2)])
    for viewer in serving(catalog_of(results_file, baseline=catalog_of(baseline_file))):
        browser.get(viewer.url)
        browser.find_element(By.LINK_TEXT, "compared with the baseline").click()
        WebDriverWait(browser, 20).until(lambda driver: driver.current_url.endswith("/compare"))
        assert "improved" in browser.find_element(By.CSS_SELECTOR, "table.figures").text
        screenshot(browser, "compare")
        browser.find_element(By.LINK_TEXT, "1").click()
        WebDriverWait(browser, 20).until(lambda driver: driver.current_url.endswith("/compare/1"))
        columns = browser.find_elements(By.CSS_SELECTOR, ".side > div")
        assert [column.find_element(By.TAG_NAME, "h2").text for column in columns] == ["baseline", "this run"]


def test_json_of_the_raw_line(browser: webdriver.Chrome, viewer: Viewer):
    browser.get(viewer.url.rstrip("/") + "/raw/0")
    assert json.loads(browser.find_element(By.TAG_NAME, "body").text)["_ng_task_index"] == 0

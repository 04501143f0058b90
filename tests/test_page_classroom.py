"""AppTest of what a class meets on the pages (tiny pair): long pastes, a fresh visit at D1, predictions answered."""

from __future__ import annotations

import time

from specviz.settings import MAX_PROMPT_CHARS
from tests.test_page_watch import APP, ShellAppTest, html, make_app, no_exception, play_to_end, texts


def test_a_fresh_visit_opens_at_the_story_level():
    at = ShellAppTest(APP, default_timeout=120)
    at.query_params.update({"pair": "tiny-random"})  # no level in the link
    at.run()
    no_exception(at)
    assert at.radio(key="cfg.level").value == "d1"
    assert at.title[0].value == "Watch the helper at work"


def test_a_paste_over_the_limit_keeps_the_text_and_says_so():
    at = make_app()
    at.run()
    at.text_area(key="watch.prompt").input("ab " * 9000).run()  # 27,000 characters
    no_exception(at)
    assert len(at.text_area(key="watch.prompt").value) == MAX_PROMPT_CHARS
    assert "27,000 characters" in texts(at) and "keeps the first 20,000" in texts(at)
    assert "The prompt is empty" not in texts(at)


def test_the_race_asks_first_and_answers_from_its_own_measurement():
    at = play_to_end(make_app())
    assert "How much faster will the helper make this run?" in texts(at)
    at.radio(key="watch.predict.race").set_value("Three times or more").run()
    at.session_state["watch.race_t0"] = time.time() - 3600  # the race was run and has finished
    at.run()
    no_exception(at)
    body = html(at)
    assert "You predicted “Three times or more”" in body and "Measured on this run:" in body
    assert "× as fast as the target alone" in body

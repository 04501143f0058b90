"""specviz Streamlit entry: page config, the shared sidebar, and the page router."""

import streamlit as st

from specviz.app.shell import inject_css, shell
from specviz.app.sidebar import sidebar_settings

st.set_page_config(page_title="specviz — speculative decoding, live", page_icon="⚡", layout="wide",
                   initial_sidebar_state="auto")  # auto: open on a wide screen, closed on a phone, where it would cover the page

# Each URL path is its file's stem, so a deep link on a fresh server (which still reads pages/ the
# old way until st.navigation has run once) finds its page; shell.run_page then draws this shell around it.
# The default page is served at / only: Streamlit matches a link by each page's public path, which is ""
# for the default, so /watch needs a hidden twin of its own (else every load of /watch shows "Page not
# found" over the page). The default keeps another internal name, as two pages may not share one.
PAGES = [
    st.Page("pages/watch.py", title="Watch it work", icon=":material/play_circle:", default=True, url_path="watch_it_work"),
    st.Page("pages/same_answer.py", title="Same answer", icon=":material/rule:", url_path="same_answer"),
    st.Page("pages/how_far.py", title="How far to guess", icon=":material/straighten:", url_path="how_far"),
    st.Page("pages/where_it_helps.py", title="Where it helps", icon=":material/bar_chart:", url_path="where_it_helps"),
    st.Page("pages/why_cheap.py", title="Why checking is cheap", icon=":material/memory:", url_path="why_cheap"),
    st.Page("pages/watch.py", title="Watch it work", icon=":material/play_circle:", url_path="watch", visibility="hidden"),
]

page = st.navigation(PAGES, position="sidebar")
settings = sidebar_settings()
inject_css(settings.presenter)
with shell():
    page.run()

"""specviz Streamlit entry: page config, the shared sidebar, and the page router."""

import streamlit as st

from specviz import ui

st.set_page_config(page_title="specviz — speculative decoding, live", page_icon="⚡", layout="wide",
                   initial_sidebar_state="expanded")

PAGES = [
    st.Page("pages/watch.py", title="Watch it work", icon=":material/play_circle:", default=True, url_path="watch"),
]

page = st.navigation(PAGES, position="sidebar")
settings = ui.sidebar_settings()
ui.inject_css(settings.presenter)
page.run()

"""Why checking is cheap lab page (being built)."""

import streamlit as st

st.title("Why checking is cheap")
st.info("This lab is being built.")

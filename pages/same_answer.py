"""Same answer lab page (being built)."""

import streamlit as st

st.title("Same answer")
st.info("This lab is being built.")

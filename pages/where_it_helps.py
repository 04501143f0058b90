"""Where it helps lab page (being built)."""

import streamlit as st

st.title("Where it helps")
st.info("This lab is being built.")

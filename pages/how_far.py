"""How far to guess lab page (being built)."""

import streamlit as st

st.title("How far to guess")
st.info("This lab is being built.")

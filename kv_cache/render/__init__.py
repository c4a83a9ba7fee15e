"""Rendering: what people read, made only from results (never imported by them).

console.py the printed report; banner.py the lines before a run; progress.py live progress; sessions.py the
sessions table; xlsx.py the spreadsheet; plots.py and html.py the PNGs and page; compare.py and
compare_plots.py `kv-cache compare`.
"""

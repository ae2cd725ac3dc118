"""``kcover report``: one self-contained HTML page that shows what happened to a run.

The page is built from the run history (``kcover.db``, written by ``kcover
run``): :mod:`.load` reads it into the plain records of :mod:`.model`,
:mod:`.ledger` splits each attempt's time into productive and lost parts, the
charts (:mod:`.timeline`, :mod:`.charts`) are inline SVG drawn in Python, and
:mod:`.page` puts the sections together; :mod:`.output` writes the file
atomically and, on request, a PNG of the timeline with headless Chromium.
Nothing on the page reaches the network and no script runs: tooltips are SVG
``<title>`` elements, a Content-Security-Policy forbids everything else, and
every string that came from a log is HTML-escaped.
"""

from __future__ import annotations

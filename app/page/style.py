"""The page's look and its few browser-side scripts: CSS, the theme's font stack, the Results
link, scrolling to the outputs, the share link's page address and its "copied" confirmation."""

from __future__ import annotations

import gradio as gr

# System fonts only (nothing is downloaded at run time): gradio's bundled Source Sans Pro first,
# then the platforms' own UI fonts, then CJK and emoji fonts for characters Source Sans lacks
# (a Chinese or Japanese token would otherwise be drawn as empty boxes). On Debian/Ubuntu the
# CJK glyphs come from fonts-noto-cjk.
FONT_STACK = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Noto Sans", "DejaVu Sans",
              "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Source Han Sans SC", "PingFang SC",
              "Hiragino Sans", "Microsoft YaHei", "Malgun Gothic", "WenQuanYi Micro Hei", "sans-serif",
              "Noto Color Emoji", "Apple Color Emoji", "Segoe UI Emoji")

CSS = """
.tokens { line-height: 1.75; font-size: 15px; white-space: pre-wrap; min-height: 90px; max-height: 210px;
          overflow-y: auto; padding: 6px 8px; border: 1px solid var(--border-color-primary); border-radius: 6px; }
.tok { border-radius: 3px; padding: 1px 0; }
.nl { color: inherit; font-size: 0.8em; padding: 0 2px; }
.pane-note { font-size: 0.85em; margin-bottom: 4px; }
.row-label { font-size: 0.85em; font-weight: 600; margin: 4px 0 1px; }
.row-label + .tokens { min-height: 0; max-height: calc(3 * 1.75em + 14px); }
#status { min-height: 1.6em; }
#load-note { min-height: 26px; font-size: 0.9em; }  /* the same height with or without a line: nothing shifts */
#guide { font-size: 0.95em; }
.headline { padding: 6px 10px; border-left: 4px solid #3f9c6d; background: var(--background-fill-secondary);
            line-height: 1.5; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 0.85em; }
.legend .swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px;
                  border: 1px solid #999; }
#heatmap-note p { margin: 4px 0; font-size: 0.9em; }
.results-table table { display: block; overflow-x: auto; max-width: 100%; }
.results-table th, .results-table td { white-space: nowrap; }
/* Facts marked in a finished E2E pane (app/page/fact_view.py): the text stays #111 on its own background,
   so its contrast is kept; the mark is a frame or an underline in a dark colour. */
.fact-wrong { outline: 2px solid #b3261e; outline-offset: -1px; box-shadow: inset 0 -3px 0 #b3261e; }
.fact-made-up { box-shadow: inset 0 -3px 0 #8a4b00; outline: 1px dashed #8a4b00; outline-offset: -1px; }
.fact-stated { box-shadow: inset 0 -2px 0 #1f4e9c; }
/* One mark per fact, over its whole words. In SkipDecode's pane a mark holds the tokens that spell them, whose
   own backgrounds would cover an inset shadow, so the marks are an outline and text decorations (drawn over
   them), with room around a short word ("3" of "3 out of 5") so its box shows. */
.fact { padding: 1px 3px; border-radius: 3px; box-shadow: none; }
.fact-wrong { outline-offset: 0; }
.fact-stated, .fact-made-up { text-decoration-line: underline; text-decoration-thickness: 2px; text-underline-offset: 3px; }
.fact-stated { text-decoration-color: #1f4e9c; }
.fact-made-up { text-decoration-style: dashed; text-decoration-color: #8a4b00; }
.fact-legend { margin: 0 0 4px; }
/* A TL;DR's line on the post's main subject (app/page/fact_view.py subject_line): a block of its own. */
.subject-line { margin: 4px 0; }
.fact-legend .fact { white-space: nowrap; }
/* Under a finished pane's text: it stopped at the token limit, or it repeats a sentence (app/page/views.py). */
.end-note { font-size: 0.85em; margin-top: 3px; }
#stop-btn.idle, #stop-btn:disabled { filter: grayscale(1); opacity: 0.45; cursor: not-allowed; }
.qr svg { display: block; background: #ffffff; width: min(100%, var(--qr-size, 340px)); height: auto;
          shape-rendering: crispEdges; }
.qr div { font-size: 0.85em; }
"""

# A click on the headline's "Results" link opens the Results tab (a link cannot select a tab).
HEAD = r"""<script>
document.addEventListener('click', (event) => {
  if (!event.target.closest('a.to-results')) return;
  event.preventDefault();
  const tab = Array.from(document.querySelectorAll('button[role=tab]')).find(b => b.textContent.trim() === 'Results');
  if (tab) { tab.click(); window.scrollTo({top: 0}); }
});
// Stop is disabled while nothing runs: a Generate or lesson click turns it on; a run's last status
// ("Done." or "Stopped."), a refused click's status ("Not run: ...") or an error toast turns it off.
(() => {
  let shown = null;
  const setStop = (on) => {
    const stop = document.querySelector('#stop-btn');
    if (!stop) return;
    stop.disabled = !on;
    stop.classList.toggle('idle', !on);
    stop.setAttribute('aria-disabled', String(!on));
  };
  // a refusal is read where it is said: on a phone the status line sits far below Generate
  const showStatus = () => {
    const status = document.querySelector('#status');
    const top = status ? status.getBoundingClientRect().top : 0;
    if (status && (top < 0 || top > window.innerHeight * 0.8)) status.scrollIntoView({block: 'center'});
  };
  // a refused click (STOP_IDLE_JS; the same line twice is no change to the watcher below)
  window.skipdecodeStopIdle = () => { setStop(false); showStatus(); };
  window.skipdecodeStopBusy = () => setStop(true);  // a run started by a lesson's link, not a click (STOP_BUSY_JS)
  document.addEventListener('click', (event) => {
    if (event.target.closest('#generate-btn, #lesson-run, #lesson-then')) setStop(true);
  }, true);
  setInterval(() => {
    const stop = document.querySelector('#stop-btn');
    if (stop && !stop.dataset.watched) { stop.dataset.watched = '1'; setStop(false); }
    const status = document.querySelector('#status');
    // the status's own last line: gradio's progress overlay ("0.1s") over the last run's "Stopped."
    // while the next run waits is no new end
    const text = status ? status.innerText.trim().split('\n').pop() : '';
    const error = document.querySelector('.toast-body.error') !== null;
    const state = text + '|' + error;
    if (state === shown) return;
    shown = state;
    if (/(^|\s)(Done|Stopped)\.\s*$/.test(text) || /^Not run:/.test(text) || error) setStop(false);
    if (/^Not run:/.test(text)) showStatus();
  }, 250);
})();
</script>"""

# The gate after a click's checks (app/ui.py _click_checks), in the page: a refused click's chain ends
# here (a failed event, on no component: no badge, no toast; the status line says why), with no call
# to the server.
GATE_JS = "(allowed) => { if (!allowed) throw new Error('refused: the status line says why'); return []; }"
# A click refused at its checks: Stop goes idle at once, even when the status line already read the
# same refusal (the watcher above sees no change then). A run a lesson's link starts lights it.
STOP_IDLE_JS = "() => { if (window.skipdecodeStopIdle) window.skipdecodeStopIdle(); }"
STOP_BUSY_JS = "() => { if (window.skipdecodeStopBusy) window.skipdecodeStopBusy(); }"

# After Generate or a lesson: bring the outputs into view when they are not (a phone, where they
# sit below the controls, or a page scrolled down to the lessons).
SCROLL_TO_OUTPUTS = """() => {
  const target = document.querySelector('#status');
  if (!target) return;
  const top = target.getBoundingClientRect().top;
  if (top < 0 || top > window.innerHeight * 0.6) target.scrollIntoView({behavior: 'smooth', block: 'start'});
}"""

# The share button's first input is this page's address (the server cannot know it behind a proxy).
PAGE_URL_JS = """(...values) => { values[0] = window.location.origin + window.location.pathname; return values; }"""

COPY_JS = """async (link) => {
  if (!link) return '';
  try { await navigator.clipboard.writeText(link); return 'Copied to the clipboard.'; }
  catch (error) { return 'Select the link above and copy it (this browser did not allow the clipboard).'; }
}"""


def theme() -> gr.themes.Base:
    return gr.themes.Default(font=(gr.themes.LocalFont("Source Sans Pro"), *FONT_STACK))


def launch_style() -> dict:
    return {"css": CSS, "theme": theme(), "head": HEAD}

/* specviz presenter mode and the page's small helpers (loaded in the page's <head> by app.py).
 *
 * - window.svPresent.set(on): presenter mode on or off (class "sv-present" on <body>; the style
 *   sheet enlarges the round view, the race, the narration and the plots' frames, and hides the
 *   settings column behind a drawer).  The page's "Presenter mode" checkbox and ?present=1 call it.
 * - Plotly figures: in presenter mode every visible figure's text is scaled by PLOT_SCALE (fonts,
 *   title and bottom margins, height), and put back when it ends; a figure the server sends anew is
 *   scaled again.  Figures are resized when their box changes width (two per row in presenter mode).
 * - Keys, in presenter mode, unless focus is in a text field: ← / → previous / next round, space
 *   play / pause (Next every PLAY_MS until the last round), Home / End first / last round, Escape
 *   closes the settings drawer.  They click the step-mode buttons (#sv-prev, #sv-next, #sv-first,
 *   #sv-last), so they do exactly what the buttons do.  The Play button reads "⏸ Pause" while playing.
 *   A pause stops on the round the page shows: a round a tick asked for and the server had not drawn yet
 *   when the pause came is stepped back from once it arrives (a second space let it through: issue 65).
 * - Any figure (presenter mode or not) whose title, subtitle or x-axis title is wider than the figure
 *   (a phone, or presenter mode's larger text) gets that text's font reduced until it fits.
 * - Tooltips (.sv-tip inside a chip) are placed in the viewport (position: fixed) when shown, above
 *   the chip when there is no room below, so a scrolling panel's edge never cuts them off.
 */
(() => {
  if (window.svPresent) return;
  const PLOT_SCALE = 1.4;
  const PLAY_MS = 1800;
  const body = () => document.body;
  const on = () => !!document.body && document.body.classList.contains("sv-present");
  const click = (sel) => { const b = document.querySelector(sel); if (b && !b.disabled) b.click(); return !!b; };

  // ---- presenter mode ----------------------------------------------------------------------------
  function set(v) {
    v = !!v;
    body().classList.toggle("sv-present", v);
    if (!v) { drawer(false); pause(); }
    setTimeout(syncPlots, 50);
    return v;
  }
  function drawer(open) {
    const b = body();
    const now = typeof open === "boolean" ? open : !b.classList.contains("sv-drawer-open");
    b.classList.toggle("sv-drawer-open", now && on());
    return now;
  }

  // ---- step mode: play / pause ---------------------------------------------------------------------
  const PLAY_LABEL = "▶ Play", PAUSE_LABEL = "⏸ Pause";
  const HOLD_MS = 8000;  // how long a pause waits for the round a tick asked for (then gives up)
  let timer = null;
  let tick = null;  // {from, to}: the round a tick's Next left and the round it asked for
  let hold = null;  // {from, to, until}: paused while that round was on its way: back to `from` when it comes
  let holdTimer = null;
  function roundNow() {
    const box = document.querySelector("#sv-step input[type=number]");
    if (!box) return null;
    return { at: Number(box.value), last: Number(box.getAttribute("max")) };
  }
  function shownRound() {  // the round the narration shows: what the room sees
    const el = document.querySelector("#sv-narration .sv-narration") || document.querySelector("#sv-narration");
    const m = /^Round (\d+)\b/.exec((el?.textContent || "").trim());
    return m ? Number(m[1]) : null;
  }
  function label() {  // the Play button says what it will do
    const btn = document.querySelector("#sv-play");
    if (!btn) return;
    const text = timer ? PAUSE_LABEL : PLAY_LABEL;
    const node = [...btn.childNodes].find((n) => n.nodeType === 3 && n.nodeValue.trim());
    if (node) { if (node.nodeValue !== text) node.nodeValue = text; }
    else if (btn.textContent.trim() !== text) btn.textContent = text;
    btn.setAttribute("aria-pressed", timer ? "true" : "false");
  }
  function watchHold() {  // the asked-for round arrived: one step back, to the round shown at the pause
    const r = roundNow();
    if (!hold || !r || performance.now() > hold.until) { stopHold(); return; }
    if (r.at === hold.to) { stopHold(); click("#sv-prev"); }
  }
  function stopHold() { hold = null; if (holdTimer) clearInterval(holdTimer); holdTimer = null; }
  function pause(keep) {
    if (timer) clearInterval(timer);
    const was = !!timer;
    timer = null;
    body().classList.remove("sv-playing");
    label();
    // `keep`: a pause from Play / space stays on the round shown (a key that steps does its own step)
    if (keep && was && tick && shownRound() === tick.from) {
      hold = { from: tick.from, to: tick.to, until: performance.now() + HOLD_MS };
      if (!holdTimer) holdTimer = setInterval(watchHold, 50);
      watchHold();
    }
    tick = null;
  }
  function play() {
    const r = roundNow();
    if (!r) return;
    stopHold();
    if (r.at >= r.last) click("#sv-first");  // from the top again
    body().classList.add("sv-playing");
    timer = setInterval(() => {
      const s = roundNow();
      if (!s || s.at >= s.last) { pause(); return; }
      tick = { from: s.at, to: s.at + 1 };
      click("#sv-next");
    }, PLAY_MS);
    label();
  }
  function togglePlay() { if (timer) pause(true); else play(); }

  // ---- keys --------------------------------------------------------------------------------------
  const TEXT_TYPES = new Set(["text", "number", "search", "email", "url", "password", "tel", ""]);
  function typing(el) {
    if (!el) return false;
    if (el.isContentEditable) return true;
    const tag = el.tagName;
    if (tag === "TEXTAREA" || tag === "SELECT") return true;
    return tag === "INPUT" && TEXT_TYPES.has((el.getAttribute("type") || "").toLowerCase());
  }
  function showStepper() {
    const st = document.querySelector("#sv-stepper");
    if (!st) return;
    const r = st.getBoundingClientRect();
    if (r.top < 0 || r.top > window.innerHeight * 0.5) st.scrollIntoView({ block: "start", behavior: "smooth" });
  }
  const KEYS = {
    ArrowLeft: () => { pause(); click("#sv-prev"); },
    ArrowRight: () => { pause(); click("#sv-next"); },
    " ": () => togglePlay(),
    Home: () => { pause(); click("#sv-first"); },
    End: () => { pause(); click("#sv-last"); },
  };
  document.addEventListener("keydown", (e) => {
    if (!on()) return;
    if (e.key === "Escape" && body().classList.contains("sv-drawer-open")) { drawer(false); return; }
    if (e.altKey || e.ctrlKey || e.metaKey || e.shiftKey || typing(e.target)) return;
    const act = KEYS[e.key];
    if (!act) return;
    e.preventDefault();  // no page scroll on space / Home / End, no button press on space
    e.stopPropagation();
    showStepper();
    act();
  }, true);
  document.addEventListener("keyup", (e) => {  // a focused button would still take space's keyup as a click
    if (on() && e.key === " " && !typing(e.target)) e.preventDefault();
  }, true);
  document.addEventListener("click", (e) => {  // a click outside the open drawer closes it
    const b = body();
    if (!b || !b.classList.contains("sv-drawer-open")) return;
    if (e.target.closest("#sv-controls, #sv-drawer-btn, [role=listbox], .options")) return;
    drawer(false);
  }, true);

  // ---- plots ---------------------------------------------------------------------------------------
  function sizes(el) {
    const F = el._fullLayout || {};
    const font = (F.font && F.font.size) || 12;
    const o = {
      "font.size": font,
      "title.font.size": (F.title && F.title.font && F.title.font.size) || Math.round(font * 1.4),
      "legend.font.size": (F.legend && F.legend.font && F.legend.font.size) || font,
      "margin.t": (F.margin && F.margin.t) || 80,
      "margin.b": (F.margin && F.margin.b) || 80,
      "height": (el.layout && el.layout.height) || null,
    };
    // a legend under the plot moves down with the larger tick labels and axis title
    if (F.showlegend && F.legend && F.legend.y < 0) o["legend.y"] = F.legend.y;
    if (F.title && F.title.subtitle && F.title.subtitle.font) o["title.subtitle.font.size"] = F.title.subtitle.font.size;
    ((el.layout && el.layout.annotations) || []).forEach((a, i) => {
      const full = F.annotations && F.annotations[i];
      o[`annotations[${i}].font.size`] = (full && full.font && full.font.size) || font;
    });
    return o;
  }
  const GROW = { "height": 1.35, "margin.b": 1.6, "legend.y": 1.55 };  // beyond the text's own scale
  function scaled(o, k) {
    const out = {};
    for (const [key, v] of Object.entries(o)) {
      if (v === null || v === undefined) { out[key] = null; continue; }
      const f = k === 1 ? 1 : (GROW[key] || k);
      out[key] = key === "legend.y" ? v * f : Math.round(v * f);
    }
    return out;
  }
  function syncPlot(el) {
    if (!window.Plotly || !el.layout || !el._fullLayout || el.offsetWidth === 0) return;
    const want = on();
    const mine = el.__svLayout === el.layout;  // the layout this script scaled (a new figure is a new object)
    if (want && !mine) {
      const o = sizes(el);
      el.__svOrig = o;
      el.__svLayout = el.layout;
      window.Plotly.relayout(el, scaled(o, PLOT_SCALE)).then(() => { el.__svLayout = el.layout; });
      return;
    }
    if (!want && mine && el.__svOrig) {
      const o = el.__svOrig;
      el.__svOrig = null;
      el.__svLayout = null;
      window.Plotly.relayout(el, scaled(o, 1));
      return;
    }
    // Gradio sizes a figure to its box when it draws it; a box that changed width later (two plots to
    // a row in presenter mode, one when it ends) is followed here.
    const box = el.parentElement && Math.floor(el.parentElement.clientWidth);
    const w = el._fullLayout.width;
    if (box > 50 && w && Math.abs(box - w) > 4 && !el.__svSizing) {
      el.__svSizing = true;
      window.Plotly.relayout(el, { width: box }).finally(() => { el.__svSizing = false; });
    }
  }
  // Text that would run past the figure's edge: its font is reduced to fit (never below 9 px).
  const FIT = { "gtitle": "title.font.size", "gtitle-subtitle": "title.subtitle.font.size", "xtitle": "xaxis.title.font.size" };
  function fitPlot(el) {
    if (!window.Plotly || !el._fullLayout || el.offsetWidth === 0 || el.__svFitting || el.__svSizing) return;
    if (on() !== (el.__svLayout === el.layout)) return;  // presenter scaling not applied (or undone) yet
    if (el.parentElement && Math.abs(el.parentElement.clientWidth - el._fullLayout.width) > 4) return;  // not resized yet
    const svg = el.querySelector("svg.main-svg");
    if (!svg) return;
    const box = svg.getBoundingClientRect();
    const F = el._fullLayout, upd = {};
    el.querySelectorAll(".infolayer text").forEach((t) => {
      const key = FIT[t.getAttribute("class")];
      if (!key || key in upd) return;
      const r = t.getBoundingClientRect();
      if (!r.width) return;
      const over = Math.max(box.left + 2 - r.left, r.right - (box.right - 2), 0);
      if (over <= 0) return;
      const path = key.split(".");
      let size = F;
      for (const p of path) size = size && size[p];
      size = size || (F.font && F.font.size) || 12;
      const ratio = Math.max(0.3, (r.width - 2 * over - 4) / r.width);
      const next = Math.max(9, Math.floor(size * ratio));
      if (next < size) upd[key] = next;
    });
    if (Object.keys(upd).length) {
      el.__svFitting = true;
      window.Plotly.relayout(el, upd).finally(() => { el.__svFitting = false; });
    }
  }
  function syncPlots() {
    document.querySelectorAll(".js-plotly-plot").forEach((el) => { syncPlot(el); fitPlot(el); });
  }
  setInterval(() => { syncPlots(); label(); }, 700);  // cheap: a dozen figures; catches figures the server redraws

  // ---- tooltips: inside the viewport, never cut off by a scrolling panel ----------------------------
  function placeTip(chip) {
    const tip = chip.querySelector(":scope > .sv-tip");
    if (!tip) return;
    tip.classList.add("sv-tip--fixed");
    const c = chip.getBoundingClientRect();
    const w = tip.offsetWidth, h = tip.offsetHeight, gap = 7, pad = 6;
    let top = c.bottom + gap;
    if (top + h > window.innerHeight - pad && c.top - gap - h >= pad) top = c.top - gap - h;
    top = Math.max(pad, Math.min(top, window.innerHeight - h - pad));
    const left = Math.max(pad, Math.min(c.left, window.innerWidth - w - pad));
    tip.style.top = `${Math.round(top)}px`;
    tip.style.left = `${Math.round(left)}px`;
  }
  const chipOf = (e) => e.target && e.target.closest && e.target.closest(".sv-chip");
  document.addEventListener("mouseover", (e) => { const c = chipOf(e); if (c) placeTip(c); }, true);
  document.addEventListener("focusin", (e) => { const c = chipOf(e); if (c) placeTip(c); }, true);

  window.svPresent = { set, drawer, play, pause, togglePlay, syncPlots, isOn: on, PLOT_SCALE };
})();

/* specviz standalone page: plays the frames the page's Python views drew (specviz.views.export_frames).
 *
 * The data block holds a pool of HTML fragments and, per frame, the indices of its fragments; a
 * frame's HTML is their concatenation, exactly what the app's view returned at that moment.  This
 * script only swaps those strings in: it draws no markup of its own.  No network, no modules.
 */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("sv-x-data").textContent);
  var pool = data.pool;

  function join(indices) {
    var out = "";
    for (var i = 0; i < indices.length; i++) out += pool[indices[i]];
    return out;
  }

  function $(id) { return document.getElementById(id); }

  /* Frames are stored as edits of the frame before: [a, b] copies prev[a:b], a number is a new fragment. */
  function expand(list, key) {
    var out = [], prev = [];
    for (var i = 0; i < list.length; i++) {
      var ops = key ? list[i][key] : list[i], cur = [];
      for (var j = 0; j < ops.length; j++) {
        var op = ops[j];
        if (typeof op === "number") cur.push(op);
        else for (var k = op[0]; k < op[1]; k++) cur.push(prev[k]);
      }
      out.push(cur);
      prev = cur;
    }
    return out;
  }

  function setHtml(el, html) {
    if (el && el.__svHtml !== html) {
      el.innerHTML = html;
      el.__svHtml = html;
    }
  }

  /* A frame player: show(i) draws frame i; durations in seconds at speed 1. */
  function Player(opts) {
    var self = this;
    self.n = opts.count;
    self.at = opts.start;
    self.timer = null;
    self.opts = opts;
    self.playBtn = $(opts.ids.play);
    self.scrub = $(opts.ids.scrub);
    self.speed = $(opts.ids.speed);
    if (self.scrub) {
      self.scrub.max = String(Math.max(self.n - 1, 0));
      self.scrub.value = String(self.at);
      self.scrub.addEventListener("input", function () { self.pause(); self.go(parseInt(self.scrub.value, 10)); });
    }
    if (self.playBtn) self.playBtn.addEventListener("click", function () { self.toggle(); });
  }
  Player.prototype.go = function (i) {
    this.at = Math.max(0, Math.min(this.n - 1, i));
    if (this.scrub) this.scrub.value = String(this.at);
    this.opts.show(this.at);
  };
  Player.prototype.rate = function () {
    var v = this.speed ? parseFloat(this.speed.value) : 1;
    return v > 0 ? v : 1;
  };
  Player.prototype.tick = function () {
    var self = this;
    var wait = self.opts.seconds(self.at) * 1000 / self.rate();
    self.timer = window.setTimeout(function () {
      if (self.at >= self.n - 1) { self.pause(); return; }
      self.go(self.at + 1);
      self.tick();
    }, wait);
  };
  Player.prototype.play = function () {
    if (this.timer !== null) return;
    if (this.at >= this.n - 1) this.go(0);  // at the end, Play starts again from the first frame
    else this.go(this.at);
    this.label(true);
    this.tick();
  };
  Player.prototype.pause = function () {
    if (this.timer !== null) window.clearTimeout(this.timer);
    this.timer = null;
    this.label(false);
  };
  Player.prototype.toggle = function () { if (this.timer === null) this.play(); else this.pause(); };
  Player.prototype.label = function (playing) {
    if (!this.playBtn) return;
    this.playBtn.textContent = playing ? this.opts.labels.pause : this.opts.labels.play;
    this.playBtn.setAttribute("aria-pressed", playing ? "true" : "false");
    document.body.setAttribute(this.opts.flag, playing ? "playing" : "paused");
  };

  /* ---- the rounds (and tree) panel ---- */
  var frames = data.rounds, shownIdx = expand(frames, "r"), treeIdx = expand(frames, "t");
  var roundsEl = $("sv-rounds"), treeEl = $("sv-tree"), statusEl = $("sv-x-status"), posEl = $("sv-x-pos");
  var rounds = new Player({
    count: frames.length, start: frames.length - 1, flag: "data-rounds",
    ids: { play: "sv-x-play", scrub: "sv-x-scrub", speed: "sv-x-speed" },
    labels: { play: "\u25b6 Play", pause: "\u275a\u275a Pause" },
    seconds: function (i) { return frames[i].s; },
    show: function (i) {
      var f = frames[i];
      setHtml(roundsEl, join(shownIdx[i]));
      setHtml(treeEl, join(treeIdx[i]));
      statusEl.textContent = f.l;
      posEl.textContent = "Round " + f.n + " of " + data.nRounds + " \u00b7 frame " + (i + 1) + " of " + frames.length;
      document.body.setAttribute("data-frame", String(i));
    }
  });

  function roundStart(i, dir) {
    /* the first frame of the round before / after the one frame i shows */
    var n = frames[i].n, j = i;
    if (dir < 0) {
      while (j > 0 && frames[j].n >= n) j--;
      var m = frames[j].n;
      while (j > 0 && frames[j - 1].n === m) j--;
      return j;
    }
    while (j < frames.length - 1 && frames[j].n <= n) j++;
    return j;
  }
  function on(id, fn) { var el = $(id); if (el) el.addEventListener("click", fn); }
  on("sv-x-first", function () { rounds.pause(); rounds.go(0); });
  on("sv-x-last", function () { rounds.pause(); rounds.go(frames.length - 1); });
  on("sv-x-back", function () { rounds.pause(); rounds.go(rounds.at - 1); });
  on("sv-x-fwd", function () { rounds.pause(); rounds.go(rounds.at + 1); });
  on("sv-x-prev-round", function () { rounds.pause(); rounds.go(roundStart(rounds.at, -1)); });
  on("sv-x-next-round", function () { rounds.pause(); rounds.go(roundStart(rounds.at, 1)); });
  document.addEventListener("keydown", function (e) {
    var tag = (e.target && e.target.tagName) || "";
    if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA" || tag === "BUTTON") return;
    if (e.key === " ") { e.preventDefault(); rounds.toggle(); }
    else if (e.key === "ArrowLeft") { rounds.pause(); rounds.go(rounds.at - 1); }
    else if (e.key === "ArrowRight") { rounds.pause(); rounds.go(rounds.at + 1); }
  });
  posEl.textContent = "Round " + frames[frames.length - 1].n + " of " + data.nRounds + " \u00b7 frame " +
    frames.length + " of " + frames.length;
  document.body.setAttribute("data-frame", String(frames.length - 1));
  document.body.setAttribute("data-rounds", "paused");

  /* ---- the race, replayed from its recorded timestamps ---- */
  var race = data.race, raceIdx = expand(race.frames, null), raceEl = $("sv-race"), clockEl = $("sv-x-race-pos");
  if (race.frames.length) {
    var racePlayer = new Player({
      count: race.frames.length, start: race.frames.length - 1, flag: "data-race",
      ids: { play: "sv-x-race-play", scrub: "sv-x-race-scrub", speed: "sv-x-race-speed" },
      labels: { play: "\u21bb Replay the race in real time", pause: "\u275a\u275a Pause the race" },
      seconds: function () { return race.step; },
      show: function (i) {
        setHtml(raceEl, join(raceIdx[i]));
        var end = race.times[race.times.length - 1];
        clockEl.textContent = "t = " + race.times[i].toFixed(1) + " s of " + end.toFixed(1) + " s" +
          (race.speed > 1 ? " (played " + race.speed.toFixed(1) + "\u00d7 faster)" : "");
      }
    });
    document.body.setAttribute("data-race", "paused");
    var end = race.times[race.times.length - 1];
    clockEl.textContent = "the finished race: " + end.toFixed(1) + " s" +
      (race.speed > 1 ? " (a replay plays " + race.speed.toFixed(1) + "\u00d7 faster)" : "");
  }

  /* ---- the plots (plotly.js, inlined above) ---- */
  var plots = data.plots || [];
  for (var k = 0; k < plots.length; k++) {
    var el = $(plots[k].id);
    if (!el) continue;
    try {
      if (typeof Plotly === "undefined") throw new Error("plotly.js is missing");
      Plotly.newPlot(el, plots[k].fig.data || [], plots[k].fig.layout || {},
                     { responsive: true, displaylogo: false });
    } catch (err) {
      el.textContent = "This chart could not be drawn: " + err.message;
    }
  }
  document.body.setAttribute("data-ready", "1");
})();

"""The viewer: result files shown in a browser, served from the files (`server`) or written as one
page (`static`). `catalog` indexes the files (byte offsets and a few fields a rollout, never the
rollouts) and counts their figures as --summarize does; `pages` renders them as HTML, `pictures`
draws the charts as SVG. Nothing here fetches anything from the network, and no page runs script."""

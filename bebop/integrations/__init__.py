"""bebop as the generation backend of other RL stacks. Each integration is one module named after the stack it
plugs into, importing that stack's package, so it costs nothing to users who do not install the extra."""

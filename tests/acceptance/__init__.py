"""The shipped whole: the quickstart followed from the wheel, the demo stack, the example
project's access rules."""

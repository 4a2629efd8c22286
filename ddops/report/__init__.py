"""`ddops report`: self-contained HTML pages for shadow comparisons and rollouts."""

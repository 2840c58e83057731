"""A small query and passage list shared by the end-to-end tests (one clearly relevant passage, [2])."""

QUERY = "how long is the life cycle of a flea"
PASSAGES = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "The flea life cycle from egg to adult takes two weeks to eight months, depending on conditions.",
    "Bananas are rich in potassium and easy to digest.",
    "Cats and dogs often carry fleas; treat pets every month.",
    "The stock market closed higher on Tuesday.",
]

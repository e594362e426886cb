# Guides and comments carry no history (tests/lint/history_lint.py): no commit ids, dates, issue
# numbers or talk of the remote GPU machine's limits in docs/, README.md and the product's source
# comments; those belong to lab/ (results files, lab/journal.md). Python 3 only, no other module.
find_program(MINIDL_PYTHON3 python3)
if(MINIDL_PYTHON3)
  add_test(NAME lint.no_history
           COMMAND ${MINIDL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/history_lint.py --root ${PROJECT_SOURCE_DIR})
  add_test(NAME lint.no_history_self_test
           COMMAND ${MINIDL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/history_lint.py --self-test)
  # Every tracked file at most 2 MiB (tests/lint/size_lint.py): the tree travels to every GPU call.
  add_test(NAME lint.file_sizes
           COMMAND ${MINIDL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/size_lint.py --root ${PROJECT_SOURCE_DIR})
  add_test(NAME lint.file_sizes_self_test COMMAND ${MINIDL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/size_lint.py --self-test)
  set_tests_properties(lint.no_history lint.no_history_self_test lint.file_sizes lint.file_sizes_self_test
                       PROPERTIES LABELS "cpu" TIMEOUT 60)
else()
  message(STATUS "minidl: python3 not found; the lint.no_history test is not added")
endif()

"""vulture allowlist: names vulture sees no caller for that libraries call.

Lightning hooks (training_step, on_fit_start, ...), torch.nn.Module.forward, SQLAlchemy event listeners, protobuf
fields, attributes libraries read (__signature__, batch_sampler, should_stop, exc_text) and arguments a library
signature requires (worker_id, dataloader_idx, exception). Regenerate: vulture project --make-whitelist; review
every line: a name listed here is not dead code.
"""

# ruff: noqa
_._default_root_dir
_.__signature__
_.filter_parameters_to_prune
_.on_train_epoch_start
_.on_save_checkpoint
_.on_fit_start
_.on_train_epoch_start
_.teardown
_.on_train_epoch_start
_.on_train_batch_start
_.save_config
_.add_arguments_to_parser
_.prepare_data
_.train_dataloader
_.val_dataloader
_.predict_dataloader
_.batch_sampler
worker_id
_.log_severity_level
_.configure_model
_.forward
_.flops_per_batch
_.training_step
_.validation_step
_.test_step
_.predict_step
dataloader_idx
_.on_validation_epoch_start
_.on_validation_epoch_end
_.on_test_epoch_start
_.on_test_epoch_end
_.configure_optimizers
_.forward
_.forward
_.write_on_batch_end
dataloader_idx
_.on_train_start
_.on_train_epoch_start
_.on_exception
exception
_.on_fit_start
_.bool_value
_.string_value
_.number_value
_connect
_.isolation_level
_begin
_.exc_text
_.should_stop
_.on_test_end
_copy_param  # project/adapters.py: ModelPruning.apply_lottery_ticket_hypothesis calls it
_.print_config  # project/cli/parse_errors.py: jsonargparse reads what --print_config asked for
_._check_legacy_exist  # project/data/modules.py: torchvision's MNIST.__init__ calls it
_._sigterm_notifier_fn  # project/adapters.py: Lightning's _SignalConnector reads it when it installs its handler
_.on_train_batch_end  # project/cluster/stop.py: Lightning callback hooks
_.on_validation_start
_.on_test_start
_.on_test_batch_end
_serve_fd  # project/decode.py: the decoding helper's entry point, named in its command line

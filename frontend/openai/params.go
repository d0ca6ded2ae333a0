package openai

// ParamError is a request refused for one parameter: a 400 in the OpenAI
// error shape with Param set and a stable Code.
type ParamError struct {
	Param   string
	Code    string // invalid_value, unsupported_parameter, missing_required_parameter
	Message string
}

func (e *ParamError) Error() string { return e.Param + ": " + e.Message }

// Stable codes of ParamError.
const (
	CodeInvalidValue         = "invalid_value"
	CodeUnsupportedParameter = "unsupported_parameter"
	CodeMissingRequired      = "missing_required_parameter"
)

import { cloneElement, isValidElement, useId, type ReactElement, type ReactNode } from 'react'

interface FieldProps {
  label: ReactNode
  /** One short sentence under the input: what the value does. */
  help?: ReactNode
  /** A problem with the value, shown in red and announced to screen readers. */
  error?: string | null
  /** The one input, select or textarea; it gets the id and aria attributes. */
  children: ReactElement<Record<string, unknown>>
  className?: string
}

/** A labelled form control with its help text and error, wired for assistive technology. */
export function Field({ label, help, error, children, className }: FieldProps) {
  const id = useId()
  const helpId = `${id}-help`
  const errorId = `${id}-error`
  const describedBy = [help ? helpId : null, error ? errorId : null].filter(Boolean).join(' ') || undefined
  const control = isValidElement(children)
    ? cloneElement(children, {
        id,
        'aria-describedby': describedBy,
        'aria-invalid': error ? true : undefined,
      })
    : children
  return (
    <div className={`field${error ? ' field--invalid' : ''}${className ? ` ${className}` : ''}`}>
      <label htmlFor={id} className="field__label">
        {label}
      </label>
      {control}
      {error && (
        <p id={errorId} className="field__error" role="alert">
          {error}
        </p>
      )}
      {help && (
        <p id={helpId} className="field__help">
          {help}
        </p>
      )}
    </div>
  )
}

/** An error that belongs to the whole form or action, in a box. */
export function ErrorNotice({ error, title }: { error: string | null | undefined; title?: string }) {
  if (!error) return null
  return (
    <div className="notice notice--error" role="alert">
      {title && <p className="notice__title">{title}</p>}
      <p>{error}</p>
    </div>
  )
}

/** A plain text form of whatever was thrown, for showing to a person. */
export function errorText(error: unknown): string {
  if (error instanceof TypeError) return `The Lanner server could not be reached (${error.message}).`
  if (error instanceof Error) return error.message
  return String(error)
}
